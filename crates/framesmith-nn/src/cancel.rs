//! A stop asked for while a long call runs that has no poll of its own to take (a model built tensor by tensor
//! from its file, a run being prepared): the caller puts a poll in scope for its thread ([`while_polling`]) and
//! the work inside asks it between units of work ([`check`]), so a stop ends the call within one unit.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

thread_local! {
    static POLLS: RefCell<Vec<Rc<dyn Fn() -> bool>>> = const { RefCell::new(Vec::new()) };
    static TRIPPED: Cell<bool> = const { Cell::new(false) };
}

/// The error [`check`] gives once a stop was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stopped as asked")]
pub struct Cancelled;

/// Runs `work` with `poll` asked by every [`check`] on this thread; returns what `work` returned and whether a
/// check inside it found the stop (its error, however wrapped, is then the stop's).
pub fn while_polling<R>(poll: Rc<dyn Fn() -> bool>, work: impl FnOnce() -> R) -> (R, bool) {
    struct Pop(bool);
    impl Drop for Pop {
        fn drop(&mut self) {
            POLLS.with(|p| p.borrow_mut().pop());
            TRIPPED.with(|t| t.set(self.0));
        }
    }
    let outer = TRIPPED.with(|t| t.replace(false));
    POLLS.with(|p| p.borrow_mut().push(poll));
    let pop = Pop(outer);
    let result = work();
    let tripped = TRIPPED.with(Cell::get);
    drop(pop);
    (result, tripped)
}

/// `Err(Cancelled)` when a poll in scope on this thread says stop; `Ok` with none in scope.
pub fn check() -> Result<(), Cancelled> {
    let poll = POLLS.with(|p| p.borrow().last().cloned());
    if poll.is_some_and(|stop| stop()) {
        TRIPPED.with(|t| t.set(true));
        return Err(Cancelled);
    }
    Ok(())
}

/// [`check`] as a candle error, for loaders that return candle's `Result`.
pub fn check_candle() -> candle_core::Result<()> {
    check().map_err(candle_core::Error::wrap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_answers_the_poll_in_scope_and_reports_that_it_tripped() {
        assert_eq!(check(), Ok(()), "no poll in scope");
        let asks = Rc::new(Cell::new(0));
        let counted = asks.clone();
        let poll: Rc<dyn Fn() -> bool> = Rc::new(move || {
            counted.set(counted.get() + 1);
            counted.get() >= 3
        });
        let (done, tripped) =
            while_polling(poll, || (0..10).take_while(|_| check().is_ok()).count());
        assert_eq!((done, tripped), (2, true));
        assert_eq!(asks.get(), 3);
        assert_eq!(check(), Ok(()), "the poll leaves scope with the call");
        let (_, tripped) = while_polling(Rc::new(|| false), check);
        assert!(!tripped);
    }

    #[test]
    fn nested_scopes_ask_the_innermost_and_keep_the_outer_state() {
        let (inner, outer_tripped) = while_polling(Rc::new(|| false), || {
            let (r, t) = while_polling(Rc::new(|| true), check);
            (r, t, check())
        });
        assert_eq!(inner, (Err(Cancelled), true, Ok(())));
        assert!(!outer_tripped);
    }
}
