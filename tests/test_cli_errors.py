"""What a user can get wrong on the command line ends in one line on stderr, exit status 2 (a bad argument) or 1
(a failure while running), no traceback, and no model built: `python -m rocm_sd` and `python -m rocm_sd.tune` run
in-process here; only the import-time environment check needs a subprocess."""
from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from rocm_sd import cli, config, models
from rocm_sd.tune import cli as tune_cli

MAINS = {"rocm_sd": cli.main, "tune": tune_cli.main}


class ModelBuilt(BaseException):
    """Raised where a model would be built: a BaseException, so that no error handler of the CLIs reports it."""


@pytest.fixture(autouse=True)
def no_model(monkeypatch):
    def refuse(*args, **kwargs):
        raise ModelBuilt

    monkeypatch.setattr(models, "build_sd_pipeline", refuse)
    monkeypatch.setattr(models, "load_pipeline", refuse)
    monkeypatch.delenv("WORLD_SIZE", raising=False)  # one process, as without torchrun


@pytest.fixture
def paths(tmp_path) -> dict[str, str]:
    """The files and folders the cases name, as {name} in their arguments and phrases."""
    (tmp_path / "file.txt").write_text("a lighthouse at dawn\n")
    (tmp_path / "empty.txt").write_text("\n   \n")
    (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    (tmp_path / "nul.txt").write_bytes(b"a fox\x00\x00\n")
    (tmp_path / "model.ckpt").write_bytes(b"PK\x03\x04 a pickle")
    (tmp_path / "folder").mkdir()
    return {"tmp": str(tmp_path), "read_only": _read_only_folder(tmp_path)}


def _read_only_folder(tmp_path) -> str:
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir(mode=0o555)
        return str(folder)
    if os.path.isdir("/sys/kernel"):  # root writes in any folder a mode forbids; sysfs takes no new file even from root
        return "/sys"
    pytest.skip("no folder this user cannot write in")


def exit_status(main, argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as stop:  # argparse's own way out, should a CLI let it through
        return stop.code


OUT = ["--out", "{tmp}/out"]
GENERATE = ["generate", "--prompt", "a fox", *OUT]
TUNE = ["--dry-run"]  # tuning needs a GPU; a dry run reaches the model on a CPU too

CASES = [  # (CLI, argv, exit status, what the last line of stderr says)
    ("rocm_sd", ["bench", "--steps", "-3"], 2, "python -m rocm_sd bench: error: argument --steps: -3 is not a "
                                               "positive integer"),
    ("rocm_sd", ["bench", "--steps", "0"], 2, "argument --steps: 0 is not a positive integer"),
    ("rocm_sd", ["bench", "--steps", "many"], 2, "argument --steps: many is not a positive integer"),
    ("rocm_sd", ["bench", "--batch", "0"], 2, "argument --batch: 0 is not a positive integer"),
    ("rocm_sd", ["bench", "--size", "36"], 2, "argument --size: 36 is not a positive multiple of 8 (Stable Diffusion"),
    ("rocm_sd", ["bench", "--size", "-64"], 2, "argument --size: -64 is not a positive multiple of 8"),
    ("rocm_sd", ["bench", "--repeats", "0"], 2, "argument --repeats: 0 is not a positive integer"),
    ("rocm_sd", ["bench", "--warmup", "-1"], 2, "argument --warmup: -1 is not a non-negative integer"),
    ("rocm_sd", ["bench", "--engines", "eager,tensorrt"], 2, "argument --engines: unknown engines ['tensorrt']; "
                                                             "choose from eager, compile"),
    ("rocm_sd", ["bench", "--model", "tiny", "--engines", "rocm_sd-fbcache"], 2,
     "argument --engines: rocm_sd-fbcache: cache='fbcache' is for the diffusion transformers (SD3 / SD3.5, Flux); "
     "UNets take 'deepcache' or 'adaptive', and tiny is a UNet model"),
    ("rocm_sd", ["bench", "--model", "tiny-sd3", "--engines", "rocm_sd,rocm_sd-adaptive"], 2,
     "argument --engines: rocm_sd-adaptive: cache='adaptive' is for UNets; the diffusion transformers take 'fbcache' "
     "or 'teacache', and tiny-sd3 is a diffusion transformer"),
    ("rocm_sd", ["bench", "--out", "{tmp}/file.txt/results"], 2,
     "argument --out: {tmp}/file.txt/results: {tmp}/file.txt is a file, not a folder"),
    ("rocm_sd", ["bench", "--out", "{tmp}/file.txt"], 2, "argument --out: {tmp}/file.txt is a file, not a folder"),
    ("rocm_sd", ["bench", "--out", "{read_only}/results"], 2, "argument --out: cannot write in {read_only}: "),
    ("rocm_sd", ["demo", "--steps", "0"], 2, "python -m rocm_sd demo: error: argument --steps: 0 is not a positive "
                                             "integer"),
    ("rocm_sd", ["demo", "--size", "0"], 2, "argument --size: 0 is not a positive multiple of 8"),
    ("rocm_sd", ["demo", "--repeats", "0"], 2, "argument --repeats: 0 is not a positive integer"),
    ("rocm_sd", ["demo", "--out", "{read_only}"], 2, "argument --out: cannot write in {read_only}: "),
    ("rocm_sd", ["generate", *OUT], 2, "python -m rocm_sd generate: error: no prompts: give --prompts FILE"),
    ("rocm_sd", ["generate", "--prompts", "{tmp}/missing.txt", *OUT], 2,
     "argument --prompts: {tmp}/missing.txt does not exist"),
    ("rocm_sd", ["generate", "--prompts", "{tmp}/empty.txt", *OUT], 2,
     "argument --prompts: {tmp}/empty.txt holds no text, one item per line"),
    ("rocm_sd", ["generate", "--prompts", "{tmp}/image.png", *OUT], 2,
     "argument --prompts: {tmp}/image.png is not UTF-8 text (byte 0 cannot be decoded)"),
    ("rocm_sd", ["generate", "--prompts", "{tmp}/nul.txt", *OUT], 2,
     "argument --prompts: {tmp}/nul.txt is a binary file, not text"),
    ("rocm_sd", ["generate", "--prompts", "{tmp}/folder", *OUT], 2,
     "argument --prompts: {tmp}/folder is a folder, not a text file"),
    ("rocm_sd", [*GENERATE, "--batch", "0"], 2, "argument --batch: 0 is not a positive integer"),
    ("rocm_sd", [*GENERATE, "--steps", "0"], 2, "argument --steps: 0 is not a positive integer"),
    ("rocm_sd", [*GENERATE, "--height", "-32"], 2, "argument --height: -32 is not a positive multiple of 8"),
    ("rocm_sd", [*GENERATE, "--height", "36"], 2, "argument --height: 36 is not a positive multiple of 8"),
    ("rocm_sd", [*GENERATE, "--width", "36"], 2, "argument --width: 36 is not a positive multiple of 8"),
    ("rocm_sd", [*GENERATE, "--guidance", "nan"], 2, "argument --guidance: nan is not a finite number"),
    ("rocm_sd", [*GENERATE, "--guidance", "inf"], 2, "argument --guidance: inf is not a finite number"),
    ("rocm_sd", [*GENERATE, "--timeout-s", "0"], 2, "argument --timeout-s: 0 is not a positive number"),
    ("rocm_sd", [*GENERATE, "--mode", "cfg"], 2, "argument --mode: cfg mode splits each step over a pair of GPUs: it "
                                                 "needs an even number of processes, got 1 (torchrun"),
    ("rocm_sd", [*GENERATE, "--mode", "seq"], 2, "argument --mode: seq mode splits each step over several processes, "
                                                 "one per GPU: launch with torchrun --nproc-per-node 2"),
    ("rocm_sd", [*GENERATE, "--mode", "cfg-seq"], 2, "argument --mode: cfg-seq mode splits each step over a pair of "
                                                     "GPUs: it needs an even number of processes, got 1 (torchrun "
                                                     "--nproc-per-node 4)"),
    ("rocm_sd", [*GENERATE, "--mode", "seq", "--model", "tiny"], 2,
     "argument --mode: seq splits a diffusion transformer's tokens; tiny is a UNet model: give --model sd3 / sd35m / "
     "sd35 / flux / flux-schnell (or a model folder of one), or --mode cfg"),
    ("rocm_sd", [*GENERATE, "--mode", "patch"], 2, "argument --mode: patch mode splits each UNet step over several "
                                                   "processes, one per GPU: launch with torchrun --nproc-per-node 2"),
    ("rocm_sd", [*GENERATE, "--mode", "patch", "--model", "flux"], 2,
     "argument --mode: patch splits a UNet's rows (SD1.5 / SDXL); flux is a diffusion transformer: use --mode seq (or "
     "cfg-seq for SD3 / SD3.5)"),
    ("rocm_sd", [*GENERATE, "--patch-warmup", "0"], 2, "argument --patch-warmup: 0 is not a positive integer"),
    ("rocm_sd", [*GENERATE, "--mode", "cfg", "--patch-warmup", "2"], 2,
     "argument --patch-warmup: only --mode patch and cfg-patch have warm-up steps, not cfg"),
    ("rocm_sd", [*GENERATE, "--mode", "cfg-patch"], 2, "argument --mode: cfg-patch mode splits each step over a pair "
                                                       "of GPUs: it needs an even number of processes, got 1 (torchrun "
                                                       "--nproc-per-node 4)"),
    ("rocm_sd", [*GENERATE, "--vae-split", "on"], 2, "argument --vae-split: on splits the decode of an image over the "
                                                     "ranks that make it together (every --mode but data); in data "
                                                     "mode each image is one rank's"),
    ("rocm_sd", [*GENERATE, "--vae-split", "yes"], 2, "argument --vae-split: invalid choice: 'yes'"),
    ("rocm_sd", [*GENERATE, "--model", "sd16"], 2, "argument --model: 'sd16' is neither an architecture nor an "
                                                   "existing file or folder; accepted: an architecture (flux, "
                                                   "flux-schnell, sd15, sd21, sd3"),
    ("rocm_sd", [*GENERATE, "--model", "{tmp}/no-such-model"], 2,
     "argument --model: '{tmp}/no-such-model' is neither an architecture nor an existing file or folder"),
    ("rocm_sd", [*GENERATE, "--model", "{tmp}/model.ckpt"], 2,
     "argument --model: '{tmp}/model.ckpt' is a single-file checkpoint; accepted: an architecture"),
    ("rocm_sd", [*GENERATE, "--model", "{tmp}/folder"], 2,
     "argument --model: '{tmp}/folder' is a folder without model_index.json, not a diffusers model"),
    ("rocm_sd", [*GENERATE, "--model", "{tmp}/file.txt"], 2,
     "argument --model: '{tmp}/file.txt' is a file, not a diffusers model folder"),
    ("rocm_sd", ["generate", "--prompt", "a fox", "--out", "{tmp}/file.txt/images"], 2,
     "argument --out: {tmp}/file.txt/images: {tmp}/file.txt is a file, not a folder"),
    ("rocm_sd", ["generate", "--prompt", "a fox", "--out", "{read_only}/images"], 2,
     "argument --out: cannot write in {read_only}: "),
    ("rocm_sd", ["prepare", "--sizes", "1024"], 2, "python -m rocm_sd prepare: error: argument --sizes: 1024 is not "
                                                   "WIDTHxHEIGHT (e.g. 1024x1024,832x1216)"),
    ("rocm_sd", ["prepare", "--sizes", "1024x1024,832x36"], 2, "argument --sizes: 832x36: 36 is not a positive "
                                                               "multiple of 8"),
    ("rocm_sd", ["prepare", "--sizes", "0x512"], 2, "argument --sizes: 0x512: 0 is not a positive multiple of 8"),
    ("rocm_sd", ["prepare", "--sizes", " , "], 2, "argument --sizes: no sizes given; accepted: WIDTHxHEIGHT"),
    ("rocm_sd", ["prepare", "--batch", "0"], 2, "argument --batch: 0 is not a positive integer"),
    ("rocm_sd", ["prepare", "--vae-tiles", "yes"], 2, "argument --vae-tiles: invalid choice: 'yes'"),
    ("rocm_sd", ["prepare", "--model", "sd16"], 2, "argument --model: 'sd16' is neither an architecture"),
    ("rocm_sd", ["prepare", "--model", "{tmp}/model.ckpt"], 2,
     "argument --model: '{tmp}/model.ckpt' is a single-file checkpoint; accepted: an architecture"),
    ("tune", [*TUNE, "--model", "{tmp}/missing.safetensors"], 2,
     "python -m rocm_sd.tune: error: argument --model: '{tmp}/missing.safetensors' is neither an architecture nor "
     "an existing file or folder; accepted: an architecture (flux, flux-schnell, sd15, sd21, sd3, sd35, sd35-turbo, "
     "sd35m, sdxl, tiny, tiny-flux, tiny-sd3, tiny-xl), a local diffusers "
     "model folder or a .safetensors checkpoint file"),
    ("tune", [*TUNE, "--model", "sd16"], 2, "argument --model: 'sd16' is neither an architecture"),
    ("tune", [*TUNE, "--model", "{tmp}/model.ckpt"], 2,
     "argument --model: '{tmp}/model.ckpt' is a single-file checkpoint; accepted: an architecture"),
    ("tune", [*TUNE, "--model", "{tmp}/folder"], 2, "argument --model: '{tmp}/folder' is a folder without "
                                                    "model_index.json, not a diffusers model"),
    ("tune", [*TUNE, "--batch", "0"], 2, "argument --batch: 0 is not a positive integer"),
    ("tune", [*TUNE, "--height", "-8"], 2, "argument --height: -8 is not a positive multiple of 8"),
    ("tune", [*TUNE, "--width", "36"], 2, "argument --width: 36 is not a positive multiple of 8"),
    ("tune", [*TUNE, "--budget-s", "nan"], 2, "argument --budget-s: nan is not a finite number"),
    ("tune", [*TUNE, "--ops", "attention_v9"], 2, "argument --ops: unknown ops ['attention_v9']; choose from"),
]


def _fill(text: str, paths: dict[str, str]) -> str:
    return text.format(**paths)


@pytest.mark.parametrize("program, argv, status, message", CASES, ids=[" ".join(c[1]) for c in CASES])
def test_a_bad_argument_is_one_line_and_builds_nothing(program, argv, status, message, paths, capsys):
    assert exit_status(MAINS[program], [_fill(arg, paths) for arg in argv]) == status
    err = capsys.readouterr().err
    assert _fill(message, paths) in err.strip().splitlines()[-1], err
    assert "Traceback" not in err


def test_checking_an_output_folder_creates_nothing(paths):
    with pytest.raises(ModelBuilt):
        cli.main(["bench", "--model", "tiny", "--out", f"{paths['tmp']}/new/results"])
    assert not os.path.exists(f"{paths['tmp']}/new")  # made when the results are written


VALID = [  # arguments that pass every check: the command goes on to build its model
    ("rocm_sd", ["bench", "--size", "512", "--steps", "1", "--batch", "2", "--repeats", "1", "--warmup", "0",
                 "--engines", "eager,rocm_sd", "--out", ""]),
    ("rocm_sd", ["bench", "--size", "520"]),
    ("rocm_sd", ["demo", "--steps", "1", "--size", "64", "--repeats", "1", "--out", "{tmp}/demo"]),
    ("rocm_sd", ["--debug", "generate", "--prompts", "{tmp}/file.txt", "--prompt", "a fox", "--out", "{tmp}",
                 "--height", "64", "--width", "72", "--steps", "1", "--guidance", "-1.5", "--timeout-s", "0.5"]),
    ("rocm_sd", [*GENERATE, "--model", "tiny-xl", "--debug"]),
    ("rocm_sd", ["prepare", "--model", "tiny-flux", "--sizes", "64x64, 832X1216", "--batch", "2", "--vae-tiles", "off",
                 "--dtype", "bfloat16"]),
    ("tune", [*TUNE, "--model", "tiny", "--height", "64", "--width", "64", "--batch", "2", "--ops",
              "group_norm,geglu", "--budget-s", "10"]),
]


@pytest.mark.parametrize("program, argv", VALID, ids=[" ".join(c[1]) for c in VALID])
def test_valid_arguments_reach_the_model(program, argv, paths):
    with pytest.raises(ModelBuilt):
        MAINS[program]([_fill(arg, paths) for arg in argv])


def test_valid_arguments_parse_to_their_values(paths):
    args = cli.build_parser().parse_args(["bench", "--size", "512", "--steps", "1", "--engines", "rocm_sd,eager"])
    assert (args.size, args.steps, args.engines, args.out) == (512, 1, ("rocm_sd", "eager"), None)
    args = cli.build_parser().parse_args(["bench", "--out", "", "--engines", ""])
    assert (args.out, args.engines) == ("", ())  # no results written; the default engines
    args = cli.build_parser().parse_args(["generate", "--prompts", f"{paths['tmp']}/file.txt", "--out", "o",
                                          "--guidance", "7.5"])
    assert args.prompts == ["a lighthouse at dawn"] and args.guidance == 7.5 and args.model is None
    args = cli.build_parser().parse_args(["prepare", "--sizes", "832x1216,1024x1024,832x1216"])
    assert args.sizes == [(832, 1216), (1024, 1024)] and args.model is None and args.vae_tiles is None
    args = tune_cli.build_parser().parse_args(["--height", "1216", "--width", "832", "--ops", "geglu"])
    assert (args.height, args.width, args.ops, args.model) == (1216, 832, ("geglu",), "sd15")


def test_a_model_folder_is_one_with_model_index_json(tmp_path):
    (tmp_path / "model_index.json").write_text("{}")
    assert models.model_problem(str(tmp_path)) is None and models.model_problem("sdxl") is None


def test_a_failure_while_running_is_one_line_and_its_traceback_is_under_debug(monkeypatch, capsys):
    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(models, "build_sd_pipeline", disk_full)
    assert cli.main(["bench", "--model", "tiny", "--out", ""]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == ["python -m rocm_sd bench: error: OSError: [Errno 28] No space left on device "
                                "(--debug shows the traceback)"]
    with pytest.raises(OSError, match="No space left"):
        cli.main(["bench", "--model", "tiny", "--out", "", "--debug"])


# ---- environment variables: read at import, where a bad value must not stop the host program ------------------

def test_a_malformed_backend_variable_warns_at_import_instead_of_raising():
    env = {**os.environ, "ROCM_SD_BACKEND": "garbage"}
    code = "import rocm_sd; from rocm_sd import config; print(config.current.forced_backends)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert result.stdout.strip() == "{}"
    [warning] = [line for line in result.stderr.splitlines() if "ROCM_SD_BACKEND" in line]
    assert "ignoring ROCM_SD_BACKEND='garbage'" in warning and "op:backend" in warning and "group_norm:torch" in warning


SWITCHES = [("ROCM_SD_STRICT", "strict", False), ("ROCM_SD_LOG", "log_fallbacks", True),
            ("ROCM_SD_TUNE_ACCEPT_STALE", "tune_accept_stale", False), ("ROCM_SD_TUNE_DEFAULTS", "tune_defaults", True),
            ("ROCM_SD_REPLACE_SDPA_MATH", "replace_sdpa_math", True)]


@pytest.mark.parametrize("name, field, default", SWITCHES)
def test_a_switch_with_another_value_warns_and_keeps_its_default(name, field, default, monkeypatch, caplog):
    for value, expected in (("1", True), ("Yes", True), ("on", True), ("0", False), ("false", False), ("", default)):
        monkeypatch.setenv(name, value)
        assert getattr(config._from_env(), field) is expected, (name, value)
    monkeypatch.setenv(name, "maybe")
    with caplog.at_level(logging.WARNING, logger="rocm_sd"):
        assert getattr(config._from_env(), field) is default
    [warning] = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    assert f"ignoring {name}='maybe'" in warning and "1, true, yes, on, 0, false, no, off" in warning


def test_well_formed_backends_still_parse(monkeypatch):
    monkeypatch.setenv("ROCM_SD_BACKEND", " group_norm:torch , *:rocm_sd ")
    assert config._from_env().forced_backends == {"group_norm": "torch", "*": "rocm_sd"}


def test_an_unknown_backend_name_is_ignored_when_the_variable_is_read(monkeypatch, caplog):
    """It once passed import and raised at every op call: inference must never stop for a setting."""
    monkeypatch.setenv("ROCM_SD_BACKEND", "group_norm:torch,*:cuda")
    with caplog.at_level(logging.WARNING, logger="rocm_sd"):
        assert config._from_env().forced_backends == {}
    [warning] = [r.getMessage() for r in caplog.records if "ROCM_SD_BACKEND" in r.getMessage()]
    assert "names backend 'cuda', not one of rocm_sd, torch" in warning


@pytest.mark.parametrize("spec, applied", [("group_norm:torch,group_norm:rocm_sd", "rocm_sd"),
                                           ("group_norm:torch, layer_norm:torch, group_norm:torch", "torch")])
def test_an_op_named_twice_in_the_backend_variable_warns(monkeypatch, caplog, spec, applied):
    monkeypatch.setenv("ROCM_SD_BACKEND", spec)
    with caplog.at_level(logging.WARNING, logger="rocm_sd"):
        assert config._from_env().forced_backends["group_norm"] == applied
    [warning] = [r.getMessage() for r in caplog.records if "ROCM_SD_BACKEND" in r.getMessage()]
    assert "names group_norm 2 times" in warning and f"the last, group_norm:{applied}, applies" in warning


def _commands():
    """(name, parser) of every command line a user types: python -m rocm_sd's subcommands and the tuner."""
    import argparse

    top = cli.build_parser()
    subparsers = next(action for action in top._actions if isinstance(action, argparse._SubParsersAction))
    return [*((f"python -m rocm_sd {name}", parser) for name, parser in subparsers.choices.items()),
            ("python -m rocm_sd.tune", tune_cli.build_parser())]


def test_every_option_of_every_command_says_what_it_is():
    """--help is the reference a user reads: an option listed with no text (tune's and generate's --height / --width
    were) leaves its unit, its accepted values and its default to guessing."""
    bare = [f"{name} {action.option_strings[-1]}" for name, parser in _commands() for action in parser._actions
            if action.option_strings and action.help is None]
    assert not bare, f"options without help: {bare}"
    assert {"python -m rocm_sd generate", "python -m rocm_sd.tune", "python -m rocm_sd bench"} <= {n for n, _ in _commands()}
