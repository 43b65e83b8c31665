"""SGLang's and vLLM's launch lines as written: every flag of both launchers is honoured, said to
have no effect (one line naming it) or refused (naming it and why); their spellings (dashes or
underscores, `--flag=value`, `--no-` forms, `--config FILE.yaml`, the positional model);
docs/launch-flags.md is the table itself. The two launch lines of issue 74 start a real server."""

import json
import pathlib

import pytest
from helpers.server import demo_folder, serve

from swajax import foreign_flags
from swajax.cli import launch_flags
from swajax.cli.args import UsageError
from swajax.cli.generate import engine_fields
from swajax.cli.main import build_parser, main

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "launch-flags.md"
PARSER = build_parser()


def parsed(*argv):
    """(args, lines said, error) of a line, as `main` treats it before running."""
    said = []
    args = PARSER.parse_args(launch_flags.normalize(list(argv)))
    try:
        launch_flags.apply(args, said.append)
    except UsageError as e:
        return args, said, str(e)
    return args, said, None


@pytest.mark.parametrize("command", ["serve", "generate"])
def test_every_flag_of_both_launchers_is_known_and_answered(command):
    own = launch_flags.own_spellings(PARSER)
    outcomes = {"line": 0, "refused": 0, "honoured": 0}
    for spelling, (canonical, arity, _, _) in foreign_flags.flags().items():
        if spelling in own or canonical == "--config":
            continue  # swajax's own flag or an alias of one, or a config file (both below)
        args, said, error = parsed(command, spelling, *([] if arity == "0" else ["1"]))
        if error is not None:
            assert error.startswith(spelling) or error.startswith(canonical), error
            outcomes["refused"] += 1
        elif said:
            named = said[0].split(" ")[0]  # (an off switch: its first off spelling)
            assert len(said) == 1 and named in foreign_flags.by_canonical()[canonical][0], said
            assert "has no effect here: " in said[0], said
            outcomes["line"] += 1
        else:  # honoured: only the flags the table says it maps
            assert canonical in foreign_flags.HONOURED, spelling
            outcomes["honoured"] += 1
    assert outcomes["line"] > 700 and outcomes["refused"] >= 15 and outcomes["honoured"] >= 4, (
        outcomes
    )


def test_spellings_and_values_as_the_launchers_take_them():
    args, said, _ = parsed("serve", "--max_num_seqs=8", "--block_size", "16", "-tp", "1")
    fields = engine_fields(args)
    assert (fields["max_running"], fields["page_size"], fields["tensor_parallel"]) == (8, 16, 1)
    args, said, _ = parsed("serve", "--dtype", "half", "--kv-cache-dtype", "fp8")
    assert (args.dtype, args.kv_cache_dtype) == ("float16", "fp8_e4m3")
    args, *_ = parsed("serve", "--kv-cache-dtype", "auto", "--dtype", "float")
    assert (args.kv_cache_dtype, args.dtype) == (None, "float32")
    for off in ("--disable-", "--no-enable-"):  # vLLM 0.33's, and its earlier versions'
        args, *_ = parsed("serve", f"{off}prefix-caching", f"{off}chunked-prefill")
        assert engine_fields(args)["prefix_cache"] is False and args.chunked_prefill_size is None
    args, said, _ = parsed("serve", "--enable-prefix-caching", "--log-level", "debug")
    assert engine_fields(args)["prefix_cache"] is True and args.verbose == 2 and not said
    args, *_ = parsed("serve", "--uvicorn-log-level", "info", "--served-model-name", "a", "b")
    assert args.uvicorn_log_level == "info" and args.served_model_name == ["a", "b"]
    args, *_ = parsed("generate", "--random-seed", "7", "--max-logprobs", "5")
    assert args.seed == 7 and engine_fields(args)["max_logprobs"] == 5


def test_refusals_name_the_flag_and_why():
    for argv, why in (
        (["--enable-lora"], "LoRA"),
        (["-pp", "2"], "pipeline"),
        (["--data-parallel-size", "4"], "replica"),
        (["--ssl-keyfile", "k.pem"], "TLS"),
        (["--tool-call-parser", "hermes"], "tool calls"),
        (["--load-format", "gguf"], "safetensors"),
    ):
        _, _, error = parsed("serve", *argv)
        assert error is not None and why in error, (argv, error)
        named = error.split(" ")[0].rstrip(":")  # the flag (its launcher's first spelling)
        assert named in foreign_flags.flags() and error.startswith(
            f"{named} {argv[1:2][0]}:" if argv[1:] else named
        ), error
    for argv in (["-pp", "1"], ["--load-format", "safetensors"], ["--disable-auto-tool-choice"]):
        _, said, error = parsed("serve", *argv)
        assert error is None and len(said) == 1 and "no effect" in said[0], (argv, said)


def test_a_vllm_config_file_sets_flags_the_line_overrides(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(
        "max_num_seqs: 8\nenable_prefix_caching: false\nblock-size: 16\n"
        "served_model_name: [a, b]\nmax_model_len: 256\n"
    )
    args, *_ = parsed("serve", "--config", str(config), "--max-num-seqs", "4")
    fields = engine_fields(args)
    assert fields["max_running"] == 4 and fields["prefix_cache"] is False
    assert fields["page_size"] == 16 and fields["max_context"] == 256
    assert args.served_model_name == ["a", "b"]
    for bad, why in (("[1, 2]", "mapping"), (": :", "not YAML")):
        config.write_text(bad)
        with pytest.raises(UsageError, match=why):
            launch_flags.normalize(["serve", f"--config={config}"])


def test_the_positional_model_is_the_model(capsys):
    assert main(["serve", "tiny", "--model", "other", "--port", "0"]) == 2
    assert "the model is given twice" in capsys.readouterr().err


def test_the_flags_page_is_the_table():
    page = launch_flags.markdown(build_parser())
    assert DOCS.read_text() == page, "write launch_flags.markdown(build_parser()) to the page"


SGLANG_LINE = (
    "--model tiny --tp 1 --mem-fraction-static 0.8 --context-length 8192 "
    "--swa-full-tokens-ratio 0.5 --disable-hybrid-swa-memory --chunked-prefill-size 4096 "
    "--max-running-requests 64 --page-size 16 --enable-metrics --served-model-name x "
    "--host 127.0.0.1 --log-level info --trust-remote-code --dtype bfloat16 "
    "--kv-cache-dtype fp8_e4m3 --attention-backend triton --model-path MODEL"
)
VLLM_LINE = (
    "MODEL --max-model-len 2048 --gpu-memory-utilization 0.5 --tensor-parallel-size 1 -tp 1 "
    "--enable-prefix-caching --max-num-seqs 8 --max-num-batched-tokens 512 --served-model-name x "
    "--api-key k --generation-config vllm --block-size 16 --kv-cache-dtype fp8 "
    "--disable-log-requests --uvicorn-log-level info"
)


@pytest.mark.parametrize("line", [SGLANG_LINE, VLLM_LINE], ids=["sglang", "vllm"])
def test_a_launch_line_as_written_starts_a_server_that_answers(line, tmp_path):
    """The issue's lines with the model and the port changed, and the memory fractions of this
    machine's memory cut to what the test may take (0.8 of the host's is what the line says;
    the pools would take it), and without the warm-up (its cost: test_warmup_server.py)."""
    model = demo_folder(tmp_path / "demo")
    argv = line.replace("MODEL", str(model)).replace("--model tiny ", "").split()
    argv = [("0.02" if a in ("0.8", "0.5") else a) for a in argv]  # (the memory fractions)
    log = tmp_path / "server.log"
    proc, base = serve(model, argv, log)  # (its --model and --port: the same model, a free port)
    try:
        key = {"Authorization": "Bearer k"} if "--api-key" in argv else {}
        status, body = http_with(base, key)
        assert status == 200 and json.loads(body)["choices"][0]["text"] is not None, body
        text = log.read_text()
        for flag in ("--enable-metrics", "--trust-remote-code", "--attention-backend triton"):
            assert (f"{flag} has no effect here" in text) == (flag in line), text
        if "--disable-log-requests" in line:
            assert "--disable-log-requests has no effect here" in text
    finally:
        proc.terminate()
        proc.wait(60)


def http_with(base: str, headers: dict):
    import urllib.error
    import urllib.request

    body = json.dumps(dict(model="x", prompt="hello", max_tokens=4)).encode()
    req = urllib.request.Request(
        f"{base}/v1/completions",
        data=body,
        headers={"content-type": "application/json", **headers},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_serve_takes_a_chat_template_as_vllm_does(tmp_path):
    """A file, or the template's text; a name of SGLang's built-in templates is refused."""
    from swajax.cli.serve import chat_template
    from swajax.server.template_worker import TemplateWorker

    text = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{{ eos_token }}"
    (tmp_path / "t.jinja").write_text(text)
    assert chat_template(str(tmp_path / "t.jinja")) == text == chat_template(text)
    with pytest.raises(UsageError, match="neither a file nor a template"):
        chat_template("chatml")
    args, said, error = parsed("serve", "--chat-template", text)
    assert args.chat_template == text and not said and error is None
    model = demo_folder(tmp_path / "demo")  # its tokenizer_config.json names no eos_token
    worker = TemplateWorker(model, source=text)
    try:
        assert worker.render([{"role": "user", "content": "hi"}]) == "<user>hi"
    finally:
        worker.close()
