#!/usr/bin/env python3
"""A fault run: bad inputs and faults a new user's machine and folders produce, each given to the `framesmith`
binary; every case is timed, its peak RSS measured (`/usr/bin/time`) and its outcome classified.

    scripts/fault-run.py target/debug/framesmith /tmp/fault-run    # writes summary.json and prints a table

Outcomes: `refused` (an error that names what is wrong, exit 1/2/3), `ok` (exit 0 where success is right), `saved`
(a stop that saved, exit 130), and the failures: `panic`, `hang` (killed at the time limit), `crash` (ended by a
signal), `accepted` (exit 0 where an error was due), `long` (an error message over 4 kB), `unnamed` (the error does
not name the file or key it is about). Nothing here is tuned to a fix: each case states what a user should get.
"""

import json
import os
import shutil
import signal
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path

LIMIT_SECS = 60
RSS_LIMIT_BYTES = 16 << 30


def limit_memory():
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (RSS_LIMIT_BYTES, RSS_LIMIT_BYTES))
    os.setsid()


def run(binary, args, cwd, stdin=None):
    """Runs the binary under /usr/bin/time: (exit code or -signal, seconds, peak RSS KiB, stderr)."""
    timing = cwd / ".time"
    cmd = ["/usr/bin/time", "-q", "-f", "%M", "-o", str(timing), str(binary), *map(str, args)]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, stdin=stdin or subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=limit_memory)
    try:
        out, err = proc.communicate(timeout=LIMIT_SECS)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        code = None
    secs = time.monotonic() - started
    rss = 0
    try:
        text = timing.read_text().strip().splitlines()
        # `time` notes a signal before the number when the command was killed.
        rss = int(text[-1]) if text and text[-1].isdigit() else 0
        if text and text[0].startswith("Command terminated by signal"):
            code = -int(text[0].split()[-1])
    except (OSError, ValueError):
        pass
    return code, secs, rss, err.decode("utf-8", "replace") + out.decode("utf-8", "replace")


def classify(case, code, err):
    if code is None:
        return "hang"
    if code < 0:
        return "crash"
    if "panicked" in err or "RUST_BACKTRACE" in err or code == 101:
        return "panic"
    if case["expect"] == "ok":
        return "ok" if code == 0 else "refused-valid"
    if case["expect"] == "saved":
        return "saved" if code == 130 else "lost"
    if code == 0:
        return "accepted"
    if len(err) > 4096:
        return "long"
    names = case.get("names")
    if names and not any(n in err for n in names):
        return "unnamed"
    return "refused"


# ---------------------------------------------------------------------------------------------------------------
# Inputs


def sparse(path, size):
    with open(path, "wb") as f:
        f.truncate(size)


def safetensors(path, header, data=b"", length=None):
    raw = json.dumps(header).encode() if isinstance(header, dict) else header
    n = len(raw) if length is None else length
    path.write_bytes(struct.pack("<Q", n) + raw + data)


def demo_project(binary, root):
    demo = root / "demo"
    if not (demo / "output" / "run.toml").exists():
        subprocess.run([str(binary), "demo", "--steps", "1", "--out", str(demo)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return demo


def config_with(demo, root, name, edit):
    """The demo's run.toml with `edit(text) -> text` applied, written as `name`; each config writes into an output
    folder of its own, so that no case meets another's run (or the demo's)."""
    text = (demo / "output" / "run.toml").read_text()
    path = root / "configs" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    own_output = set_key("output", "output_dir", json.dumps(str(root / "outputs" / name)))
    path.write_text(edit(own_output(text)))
    return path


def without_key(text, key):
    """`text` without its `key = ...` lines (a key set twice in a TOML table is an error of its own)."""
    return "\n".join(l for l in text.splitlines() if l.split("=")[0].strip() != key) + "\n"


def set_key(section, key, value):
    """An edit that sets `key = value` in `[section]` (added when missing)."""
    def edit(text):
        lines = text.splitlines()
        out, in_section, done = [], False, False
        for line in lines:
            if line.startswith("["):
                if in_section and not done:
                    out.append(f"{key} = {value}")
                    done = True
                in_section = line.strip() == f"[{section}]"
            elif in_section and line.split("=")[0].strip() == key:
                line, done = f"{key} = {value}", True
            out.append(line)
        if not done:
            if not in_section:
                out.append(f"[{section}]")
            out.append(f"{key} = {value}")
        return "\n".join(out) + "\n"
    return edit


def dataset_with(demo, root, name, general=None, dataset=None, files=None):
    """A dataset folder copied from the demo's, with its TOML's keys changed and `files(folder)` run on it."""
    folder = root / "datasets" / name
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(demo / "dataset", folder / "clips", symlinks=True)
    if files:
        files(folder / "clips")
    text = (demo / "dataset.toml").read_text().replace('"dataset"', f'"{folder / "clips"}"')
    text = text.replace('cache_directory = "cache"', f'cache_directory = "{folder / "cache"}"')
    for key, value in (general or {}).items():
        text = set_key("general", key, value)(text)
    for key, value in (dataset or {}).items():
        text = without_key(text, key).replace("[[datasets]]", f"[[datasets]]\n{key} = {value}", 1)
    path = folder / "dataset.toml"
    path.write_text(text)
    return path


def cases(binary, root):
    demo = demo_project(binary, root)
    bad = root / "bad"
    bad.mkdir(parents=True, exist_ok=True)
    out = []

    def case(name, args, expect="error", names=None, stdin=None):
        out.append({"name": name, "args": args, "expect": expect, "names": names, "stdin": stdin})

    # Special and huge files wherever a file is read.
    fifo = bad / "fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    zeros_300m = bad / "zeros-300m.toml"
    sparse(zeros_300m, 300 << 20)
    sparse_3g = bad / "sparse-3g.toml"
    sparse(sparse_3g, 3 << 30)
    (bad / "empty.toml").write_bytes(b"")
    (bad / "binary.toml").write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(512))
    (bad / "latin1.toml").write_bytes("[training]\nseed = 1 # caf\xe9\n".encode("latin-1"))
    (bad / "long-line.toml").write_text("x = \"" + "a" * (8 << 20) + "\"\n")
    (bad / "nested.toml").write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    (bad / "dir.toml").mkdir(exist_ok=True)
    specials = {
        "dev-zero": "/dev/zero", "dev-null": "/dev/null", "fifo": fifo, "directory": bad / "dir.toml",
        "zeros-300m": zeros_300m, "sparse-3g": sparse_3g, "empty": bad / "empty.toml",
        "binary": bad / "binary.toml", "latin1": bad / "latin1.toml", "long-line": bad / "long-line.toml",
        "nested": bad / "nested.toml", "missing": bad / "missing.toml",
    }
    for label, path in specials.items():
        case(f"train --config {label}", ["train", "--config", path])
        case(f"plan --config {label}", ["plan", "--config", path])
        case(f"dataset check {label}", ["dataset", "check", path])
        case(f"inspect {label}", ["inspect", path])
        ds = config_with(demo, root, f"dataset-{label}.toml", set_key("dataset", "config", json.dumps(str(path))))
        case(f"train dataset.config={label}", ["train", "--config", ds])
        case(f"plan dataset.config={label}", ["plan", "--config", ds])

    # Bad numbers and names in the run config.
    numbers = [
        ("lora", "rank", "0"), ("lora", "rank", "-1"), ("lora", "rank", "1e10"), ("lora", "rank", "100000"),
        ("lora", "alpha", "nan"), ("lora", "alpha", "-inf"), ("optimizer", "learning_rate", "nan"),
        ("optimizer", "learning_rate", "-1.0"), ("optimizer", "learning_rate", "1e300"),
        ("training", "max_train_steps", "0"), ("training", "max_train_steps", "-5"),
        ("training", "max_train_steps", "18446744073709551616"), ("training", "seed", "-1"),
        ("training", "gradient_accumulation_steps", "0"), ("training", "device", '"cuda:99"'),
        ("training", "device", '"tpu"'), ("memory", "blocks_to_swap", "100000"),
        ("memory", "blocks_to_swap", '"many"'), ("memory", "vram_budget_gb", "-3"),
        ("memory", "vram_budget_gb", "nan"), ("memory", "streaming", '"sometimes"'),
        ("output", "save_every_n_steps", "-1"), ("output", "output_name", '"../../etc/passwd"'),
        ("output", "output_name", '"a/b"'), ("output", "output_name", '""'), ("model", "demo", '"yes"'),
        ("training", "timestep_sampling", '"random"'), ("optimizer", "lr_scheduler", '"sawtooth"'),
        ("lora", "init_from", '"/dev/zero"'), ("lora", "init_from", json.dumps(str(fifo))),
        ("training", "unknown_key", "1"), ("nonsense", "key", "1"),
    ]
    for section, key, value in numbers:
        path = config_with(demo, root, f"{section}.{key}={value}.toml".replace("/", "_"),
                           set_key(section, key, value))
        case(f"train {section}.{key} = {value}", ["train", "--config", path], names=[key])
        case(f"plan {section}.{key} = {value}", ["plan", "--config", path], names=[key])

    # Dataset TOMLs and folders that go wrong.
    ds_cases = {
        "num_repeats=0": dict(dataset={"num_repeats": "0"}, names=["num_repeats"]),
        "num_repeats=-1": dict(dataset={"num_repeats": "-1"}, names=["num_repeats"]),
        "batch_size=100000": dict(general={"batch_size": "100000"}, names=["batch_size"]),
        "batch_size=0": dict(general={"batch_size": "0"}, names=["batch_size"]),
        "resolution=0": dict(general={"resolution": "[0, 0]"}, names=["resolution"]),
        "resolution=huge": dict(general={"resolution": "[100000, 100000]"}, names=["resolution"]),
        "unknown key": dict(dataset={"video_dir": '"x"'}, names=["video_dir"]),
        "frames=0": dict(dataset={"target_frames": "[0]"}, names=["target_frames"]),
    }
    for label, spec in ds_cases.items():
        path = dataset_with(demo, root, label.replace("=", "-"), spec.get("general"), spec.get("dataset"))
        case(f"dataset check {label}", ["dataset", "check", path], names=spec["names"])
        conf = config_with(demo, root, f"ds-{label}.toml", set_key("dataset", "config", json.dumps(str(path))))
        case(f"train with dataset {label}", ["train", "--config", conf], names=spec["names"])

    def dangling(d):
        os.symlink(d / "gone.mp4", d / "unplugged.mp4")

    def loop(d):
        os.symlink(d / "loop-b.mp4", d / "loop-a.mp4")
        os.symlink(d / "loop-a.mp4", d / "loop-b.mp4")

    def device_link(d):
        os.symlink("/dev/zero", d / "device.mp4")

    def fifo_entry(d):
        os.mkfifo(d / "pipe.mp4")

    def truncated(d):
        first = sorted(d.glob("*.mp4"))[0]
        first.write_bytes(first.read_bytes()[:100])

    def orphan_caption(d):
        (d / "orphan.txt").write_text("a caption with no clip")

    def garbage_media(d):
        (d / "garbage.mp4").write_bytes(os.urandom(4096))
        (d / "garbage.txt").write_text("noise")

    def huge_caption(d):
        first = sorted(d.glob("*.txt"))[0]
        sparse(first, 1 << 30)

    def binary_caption(d):
        first = sorted(d.glob("*.txt"))[0]
        first.write_bytes(b"\xff\xfe\x00\x01" * 64)

    def empty_folder(d):
        for f in d.iterdir():
            f.unlink()

    entries = {"dangling symlink": (dangling, ["unplugged"]), "symlink loop": (loop, ["loop-"]),
               "link to a device": (device_link, ["device.mp4"]), "fifo entry": (fifo_entry, ["pipe.mp4"]),
               "truncated clip": (truncated, [".mp4"]), "orphan caption": (orphan_caption, ["orphan"]),
               "garbage clip": (garbage_media, ["garbage"]), "1 GiB caption": (huge_caption, [".txt"]),
               "binary caption": (binary_caption, [".txt"]), "empty folder": (empty_folder, ["dataset"])}
    for label, (make, names) in entries.items():
        path = dataset_with(demo, root, label.replace(" ", "-"), files=make)
        case(f"dataset check folder: {label}", ["dataset", "check", path.parent / "clips"], names=names)
        case(f"dataset check toml: {label}", ["dataset", "check", path], names=names)

    # Model files that are not what they claim.
    st = bad / "st"
    st.mkdir(exist_ok=True)
    tensors = {
        "header-2^40": (b"{}", 1 << 40),
        "header-100MB": (b"{" + b" " * (100 << 20) + b"}", None),
        "header-not-json": (b"this is not json", None),
        "header-array": (b"[1,2,3]", None),
        "header-truncated": (b'{"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}', None),
        "offsets-past-end": ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 1 << 40]}}, None),
        "offsets-reversed": ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [16, 0]}}, None),
        "shape-mismatch": ({"a": {"dtype": "F32", "shape": [1000], "data_offsets": [0, 16]}}, None),
        "shape-overflow": ({"a": {"dtype": "F32", "shape": [1 << 62, 1 << 62], "data_offsets": [0, 16]}}, None),
        "dtype-unknown": ({"a": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}}, None),
        "escape-names": ({"\x1b[31mred\x1b[0m\x07": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}},
                         None),
        "empty-header": ({}, None),
        "metadata-only": ({"__metadata__": {"a": "b"}}, None),
        "metadata-not-strings": ({"__metadata__": {"a": 1}}, None),
    }
    for label, (header, length) in tensors.items():
        path = st / f"{label}.safetensors"
        safetensors(path, header, b"\0" * 16, length)
        case(f"inspect {label}", ["inspect", path], names=[label])
    (st / "eight-bytes.safetensors").write_bytes(b"\xff" * 8)
    case("inspect 8 bytes", ["inspect", st / "eight-bytes.safetensors"])
    (st / "three-bytes.safetensors").write_bytes(b"abc")
    case("inspect 3 bytes", ["inspect", st / "three-bytes.safetensors"])
    (st / "model.pth").write_bytes(b"\x80\x04\x95" + os.urandom(64))
    case("inspect random pickle", ["inspect", st / "model.pth"])
    (st / "model.gguf").write_bytes(b"GGUF" + os.urandom(64))
    case("inspect gguf", ["inspect", st / "model.gguf"])

    # What a run leaves behind, inspected: the demo's own outputs, each to be named for what it is.
    produced = demo / "output"
    for label, pattern in [("the LoRA", "*.safetensors"), ("a latent cache", "../cache/*_wan.safetensors"),
                           ("a text cache", "../cache/*_te.safetensors")]:
        found = sorted(produced.glob(pattern))
        if found:
            case(f"inspect {label}", ["inspect", found[0]], expect="ok")

    # Prompts for `generate`'s prompt file / sample prompts.
    for label, line in [("frames 6", "a cat --f 6"), ("steps 0", "a cat --s 0"), ("width -1", "a cat --w -1"),
                        ("width huge", "a cat --w 100000000"), ("unknown flag", "a cat --zz 3"),
                        ("empty", ""), ("seed text", "a cat --d seven")]:
        prompts = root / "prompts" / f"{label.replace(' ', '-')}.txt"
        prompts.parent.mkdir(exist_ok=True)
        prompts.write_text(line + "\n")
        conf = config_with(demo, root, f"prompts-{label}.toml",
                           set_key("sampling", "prompts", json.dumps(str(prompts))))
        case(f"train sample prompt {label}", ["train", "--config", conf])

    # Plans with absurd sizes.
    for label, args in [("100000x100000x100001", ["--width", "100000", "--height", "100000", "--frames", "100001"]),
                        ("zero width", ["--width", "0"]), ("rank 1e9", ["--rank", "1000000000"]),
                        ("batch 0", ["--batch", "0"]), ("14B on 8 GiB of RAM",
                                                       ["--variant", "t2v-14b", "--ram-gb", "8",
                                                        "--free-vram-gb", "24", "--streaming", "pinned"])]:
        case(f"plan {label}", ["plan", "--config", demo / "output" / "run.toml", *args])

    # Resume from what is not a state.
    for label, path in [("missing", bad / "no-such-state"), ("empty dir", bad / "dir.toml"), ("a file", fifo),
                        ("dev-zero", "/dev/zero")]:
        conf = config_with(demo, root, f"resume-{label.replace(' ', '-')}.toml", lambda text: text)
        case(f"train --resume {label}", ["train", "--config", conf, "--resume", path])
    return out


def main():
    binary = Path(sys.argv[1]).resolve()
    root = Path(sys.argv[2]).resolve()
    root.mkdir(parents=True, exist_ok=True)
    results = []
    for case in cases(binary, root):
        code, secs, rss, err = run(binary, case["args"], root)
        outcome = classify(case, code, err)
        first = next((l for l in err.splitlines() if l.strip()), "")[:160]
        results.append({"case": case["name"], "code": code, "secs": round(secs, 2), "rss_kib": rss,
                        "outcome": outcome, "first_line": first})
        print(f"{outcome:10} {code!s:>5} {secs:6.2f}s {rss / 1024:8.1f} MiB  {case['name']}: {first}", flush=True)
    counts = {}
    for r in results:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    worst_time = max(results, key=lambda r: r["secs"])
    worst_rss = max(results, key=lambda r: r["rss_kib"])
    summary = {"cases": len(results), "outcomes": counts,
               "worst_time": worst_time, "worst_rss": worst_rss, "results": results}
    (root / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: summary[k] for k in ("cases", "outcomes", "worst_time", "worst_rss")}, indent=1))


if __name__ == "__main__":
    main()
