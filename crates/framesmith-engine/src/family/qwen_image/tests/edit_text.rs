//! Qwen-Image-Edit's text conditioning sees the control images, as the official edit pipelines encode a prompt:
//! the text pass caches an edit item's caption encoded with its control images (the tiny Qwen2.5-VL with its vision
//! tower) and encodes it again when one changes; `generate --control` (its prompt step: a whole edit at the ~1024²
//! the control images are sized to is too slow here) and `--ci` samples encode through the edit encoder of the
//! DiT's pipeline, and the prompt cache keys a sample by its control images' contents.

use std::cell::{Cell, RefCell};
use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};

use super::edit::edit_dataset;
use crate::family::qwen_image::encoder::{
    encode_each, EditPromptEncoder, EncoderFiles, EncoderLoaders, PromptEncoder,
};
use crate::family::qwen_image::generate::encode_prompt;
use crate::family::qwen_image::pipeline::QwenImagePrompt;
use crate::family::qwen_image::prep::{cache_qwen_text, CaptionEncoder};
use crate::family::qwen_image::setup::start_run_with;
use crate::family::qwen_image::testkit::{stand_in, stand_in_edit, tiny_edit_encoder, tiny_vae};
use crate::generate::request::{DitSource, GenerationRequest};
use crate::prep::CacheOptions;
use framesmith_config::validate::validate_for;
use framesmith_config::{HostInfo, ModelFamily};
use framesmith_data::family::qwen_image::cache::read_qwen_text_cache;
use framesmith_data::image_cache::CONTROLS_METADATA;
use framesmith_data::tensor_file::read_tensor_file;
use framesmith_models::qwen25vl::EditPipeline;

fn max_diff(a: &Tensor, b: &Tensor) -> anyhow::Result<f32> {
    Ok((a - b)?.abs()?.max_all()?.to_scalar::<f32>()?)
}

/// The cached embedding of item `stem` in `dir`'s dataset and the control record beside it.
fn cached(dir: &Path, stem: &str) -> anyhow::Result<(Tensor, Option<String>)> {
    let path = dir.join(format!("cache/{stem}_qi_te.safetensors"));
    let record = read_tensor_file(&path, &Device::Cpu)?
        .metadata
        .get(CONTROLS_METADATA)
        .cloned();
    Ok((read_qwen_text_cache(&path, &Device::Cpu)?.vl_embed, record))
}

/// What the edit encoder makes of `caption` with item `stem`'s two control images in `dir`.
fn encoded(
    encoder: &dyn EditPromptEncoder,
    dir: &Path,
    (stem, caption): (&str, &str),
) -> anyhow::Result<Tensor> {
    let images = (0..2)
        .map(|i| Ok(image::open(dir.join(format!("ctl/{stem}_{i}.png")))?.to_rgb8()))
        .collect::<anyhow::Result<Vec<_>>>()?;
    encoder.encode_edit(caption, &images)
}

#[test]
fn an_edit_caption_is_cached_with_its_control_images_and_again_when_one_changes(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let valid = framesmith_data::load_valid(&edit_dataset(dir.path(), 1)?)?;
    let encoder = tiny_edit_encoder(EditPipeline::EditPlus)?;
    let options = CacheOptions::default();
    let pass = |encoder: CaptionEncoder<'_>| {
        cache_qwen_text(&valid, encoder, DType::F32, &options, &mut ())
    };
    // Text-only caches (what the pass wrote before) are not what the edit pipeline conditions on: made again.
    assert_eq!(pass(CaptionEncoder::Text(encoder.as_ref()))?.written, 3);
    let text_only = cached(dir.path(), "a")?.0;
    let summary = pass(CaptionEncoder::Edit(encoder.as_ref()))?;
    assert_eq!((summary.written, summary.skipped), (3, 0), "{summary:?}");

    let (embed, record) = cached(dir.path(), "a")?;
    let want = encoded(encoder.as_ref(), dir.path(), ("a", "a red square"))?;
    assert_eq!(embed.dims(), want.dims());
    assert!(max_diff(&embed, &want)? <= 1e-6);
    assert_ne!(
        embed.dims(),
        text_only.dims(),
        "the image tokens are in the encoding"
    );
    let plain = encode_each(encoder.as_ref(), &["a red square"], DType::F32)?.remove(0);
    assert_eq!(plain.dims(), text_only.dims());
    let record = record.unwrap_or_default();
    assert!(
        record.starts_with("edit-2509 sha256:") && record.split(' ').count() == 3,
        "{record}"
    );

    let again = pass(CaptionEncoder::Edit(encoder.as_ref()))?;
    assert_eq!((again.written, again.skipped), (0, 3), "{again:?}");
    // Another second control image for b (same name, size and format): b alone is encoded again, with it.
    image::RgbImage::from_pixel(48, 32, image::Rgb([10, 200, 90]))
        .save(dir.path().join("ctl/b_1.png"))?;
    let changed = pass(CaptionEncoder::Edit(encoder.as_ref()))?;
    assert_eq!((changed.written, changed.skipped), (1, 2), "{changed:?}");
    let want = encoded(encoder.as_ref(), dir.path(), ("b", "a blue square"))?;
    assert!(max_diff(&cached(dir.path(), "b")?.0, &want)? <= 1e-6);
    // The first Qwen-Image-Edit takes one image: items with two stop the pass, saying so.
    let edit = tiny_edit_encoder(EditPipeline::Edit)?;
    let err = pass(CaptionEncoder::Edit(edit.as_ref()))
        .err()
        .map(|e| format!("{e:#}"));
    assert!(
        err.as_deref()
            .is_some_and(|e| e.contains("exactly one condition image")),
        "{err:?}"
    );
    Ok(())
}

/// Loaders that count their loads and keep the edit pipeline asked for.
struct Counting {
    text: Cell<usize>,
    edit: Cell<usize>,
    pipeline: Cell<Option<EditPipeline>>,
}

impl Counting {
    fn new() -> Self {
        Self {
            text: Cell::new(0),
            edit: Cell::new(0),
            pipeline: Cell::new(None),
        }
    }

    fn loads(&self) -> (usize, usize) {
        (self.text.replace(0), self.edit.replace(0))
    }
}

/// `counting`'s loaders over the stand-ins.
fn with_counting<R>(counting: &Counting, run: impl FnOnce(EncoderLoaders<'_>) -> R) -> R {
    let text =
        |f: EncoderFiles<'_>, d: DType, dev: &Device| -> anyhow::Result<Box<dyn PromptEncoder>> {
            counting.text.set(counting.text.get() + 1);
            stand_in(f, d, dev)
        };
    let edit = |f: EncoderFiles<'_>,
                p: EditPipeline,
                d: DType,
                dev: &Device|
     -> anyhow::Result<Box<dyn EditPromptEncoder>> {
        counting.edit.set(counting.edit.get() + 1);
        counting.pipeline.set(Some(p));
        stand_in_edit(f, p, d, dev)
    };
    run(EncoderLoaders {
        text: &text,
        edit: &edit,
    })
}

/// `generate`'s prompt with `request`'s controls, through `load` (the DiT is ComfyUI's first Qwen-Image-Edit).
fn generate_prompt(
    request: &GenerationRequest,
    load: EncoderLoaders<'_>,
) -> anyhow::Result<QwenImagePrompt> {
    let (te, dit) = (
        Path::new("te.safetensors"),
        Path::new("qwen_image_edit_bf16.safetensors"),
    );
    encode_prompt(request, (te, dit), load, (DType::F32, &Device::Cpu))
}

#[test]
fn generate_with_control_encodes_the_prompt_with_the_images() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let control = dir.path().join("source.png");
    let source = image::RgbImage::from_pixel(40, 24, image::Rgb([200, 40, 40]));
    source.save(&control)?;
    let dit = DitSource::File(dir.path().join("dit.safetensors"));
    let mut request = GenerationRequest::new(dit, "make it blue", dir.path().join("edit.png"));
    request.negative = Some("blurry".into());
    request.controls = vec![control];
    let counting = Counting::new();
    let prompt = with_counting(&counting, |load| generate_prompt(&request, load))?;
    assert_eq!(
        counting.loads(),
        (0, 1),
        "the edit encoder, not the text one"
    );
    // ComfyUI's name of the first Qwen-Image-Edit: its pipeline, which takes one image.
    assert_eq!(counting.pipeline.get(), Some(EditPipeline::Edit));
    let edit = stand_in_edit(files(), EditPipeline::Edit, DType::F32, &Device::Cpu)?;
    let want = edit.encode_edit("make it blue", std::slice::from_ref(&source))?;
    assert_eq!(max_diff(&prompt.embed, &want)?, 0.0);
    let negative = prompt.negative.context("a negative prompt")?;
    let want = edit.encode_edit("blurry", std::slice::from_ref(&source))?;
    assert_eq!(
        max_diff(&negative, &want)?,
        0.0,
        "the negative prompt sees the image too"
    );

    request.controls.clear();
    let plain = with_counting(&counting, |load| generate_prompt(&request, load))?;
    assert_eq!(counting.loads(), (1, 0), "no control: the text encoder");
    assert_ne!(plain.embed.dims(), prompt.embed.dims());
    Ok(())
}

fn files() -> EncoderFiles<'static> {
    EncoderFiles {
        weights: Path::new("te.safetensors"),
        tokenizer: None,
    }
}

#[test]
fn a_sample_with_control_images_is_encoded_with_them_and_cached_by_their_contents(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut config = super::config(dir.path(), 2)?;
    let control = dir.path().join("source.png");
    image::RgbImage::from_pixel(32, 32, image::Rgb([30, 30, 200])).save(&control)?;
    let prompts = dir.path().join("prompts.txt");
    std::fs::write(
        &prompts,
        format!(
            "a red square --w 32 --h 32 --s 2\nmake it red --ci {} --w 32 --h 32 --s 2\n",
            control.display()
        ),
    )?;
    config.sampling.prompts = Some(prompts);
    config.sampling.sample_every_n_steps = Some(1);
    config.model.vae = tiny_vae(dir.path())?;
    config.model.text_encoder = config.model.dit.clone();
    let plan = validate_for(&config, &HostInfo::cpu_only(), ModelFamily::QwenImage)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let counting = Counting::new();
    let lines = RefCell::new(Vec::new());
    let start = || {
        with_counting(&counting, |load| {
            start_run_with(&plan, &config.model.dit, load, &mut |_, l| {
                lines.borrow_mut().push(l)
            })
            .map(drop)
        })
    };
    start()?;
    // "a red square" and " " alone (the text encoder is not needed: the edit one reads them too), then
    // "make it red" and " " with the image.
    assert_eq!(counting.loads(), (0, 1));
    assert_eq!(counting.pipeline.get(), Some(EditPipeline::EditPlus));
    assert!(
        lines
            .borrow()
            .iter()
            .any(|l| l.contains("4 sample prompts encoded")),
        "{lines:?}"
    );
    start()?;
    assert_eq!(counting.loads(), (0, 0), "all four from the prompt cache");
    // Another control image under the same name: the two texts seen with it are encoded again.
    image::RgbImage::from_pixel(32, 32, image::Rgb([200, 200, 30])).save(&control)?;
    lines.borrow_mut().clear();
    start()?;
    assert_eq!(counting.loads(), (0, 1));
    assert!(
        lines
            .borrow()
            .iter()
            .any(|l| l.contains("2 sample prompts encoded")),
        "{lines:?}"
    );
    Ok(())
}
