"""`glimmer batch`: requests from a file through the engine, one JSON line per request; a bad line is
one error naming the file and line, before any work (CPU, a tiny model)."""

import io
import json
import sys

import pytest
from gguf_factory import tiny_model

from glimmer_cupy.cli import main


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(tiny_model(tmp_path_factory.mktemp("batch") / "tiny.gguf", "qwen3"))


def run(capsys, monkeypatch, stdin, *argv):
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, [json.loads(line) for line in out.splitlines()], err


def single(capsys, tiny, prompt, n, *sampling, device="cpu"):
    rc = main(["run", "-m", tiny, "-p", prompt, "-n", str(n), *sampling, "--json", "--device", device])
    assert rc == 0
    return json.loads(capsys.readouterr().out)["tokens"]


def test_each_request_as_it_would_run_alone(tiny, capsys, monkeypatch):
    lines = ["hello tok5 tok7", "", '{"prompt": "abc", "n": 3, "id": "x"}',
             '{"prompt": "tok9 tok9", "temperature": 1.0, "top_k": 0, "top_p": 1, "seed": 42}']
    rc, out, err = run(capsys, monkeypatch, "\n".join(lines) + "\n", "batch", "-m", tiny, "-n", "6",
                       "--temperature", "0", "--device", "cpu")
    assert rc == 0, err
    by_index = {o["index"]: o for o in out}
    assert sorted(by_index) == [0, 1, 2] and [by_index[i]["id"] for i in range(3)] == [0, "x", 2]
    assert by_index[0]["tokens"] == single(capsys, tiny, "hello tok5 tok7", 6, "--temperature", "0")
    assert by_index[1]["tokens"] == single(capsys, tiny, "abc", 3, "--temperature", "0")
    assert by_index[2]["tokens"] == single(capsys, tiny, "tok9 tok9", 6, "--temperature", "1.0", "--top-k", "0",
                                           "--top-p", "1", "--seed", "42")
    assert "batch: 3 requests (0 rejected)" in err


def test_a_request_too_long_is_answered_with_an_error_and_the_rest_run(tiny, capsys, monkeypatch):
    stdin = '{"prompt": "abc", "n": 400}\nhello\n'                 # the tiny model's context is 256
    rc, out, err = run(capsys, monkeypatch, stdin, "batch", "-m", tiny, "-n", "4", "--temperature", "0",
                       "--device", "cpu")
    assert rc == 0, err
    by_index = {o["index"]: o for o in out}
    assert "exceeds the context of 256 tokens" in by_index[0]["error"]
    assert len(by_index[1]["tokens"]) == 4 or by_index[1]["stop_reason"] == "stop token"
    assert "(1 rejected)" in err


@pytest.mark.parametrize("stdin,message", [
    ('hello\n{"prompt": "a",}\n', r"<stdin>:2: not a JSON object"),
    ('{"prompt": "a"} {"n": 2}\n', r"<stdin>:1: not a JSON object \(Extra data at column 17\)"),
    ('{"prompt": "a", "temp": 1}\n', r"<stdin>:1: unknown key 'temp'; known: prompt, n, "),
    ('{"prompt": 5}\n', r"<stdin>:1: prompt must be a string, got 5"),
    ('{"prompt": "a", "n": true}\n', r"<stdin>:1: n must be an integer, got True"),
    ('{"n": 3}\n', r"<stdin>:1: no \"prompt\""),
    ('a\n{"prompt": "b", "n": 0}\n', r"<stdin>:2: n must be > 0, got 0"),
    ('{"prompt": "a", "top_p": 0}\n', r"<stdin>:1: top-p must be in \(0, 1\], got 0.0"),
    ('{"prompt": "a", "top_k": 999}\n', r"<stdin>:1: top-k must be in \[0, 320\], got 999"),
    ('{"prompt": "a", "id": 1}\n{"prompt": "b", "id": 1}\n', r"<stdin>:2: request id 1 is also <stdin>:1's"),
    ('\n\n', r"<stdin>: no requests \(every line is empty\)"),
])
def test_a_bad_line_is_one_error_naming_it(tiny, capsys, monkeypatch, stdin, message):
    import re
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    assert main(["batch", "-m", tiny, "--device", "cpu"]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1 and "Traceback" not in err, err
    assert re.search("glimmer: error: " + message, lines[0]), lines[0]


def test_a_missing_input_file(tiny, capsys, tmp_path):
    assert main(["batch", "-m", tiny, "-i", str(tmp_path / "nope.jsonl"), "--device", "cpu"]) == 2
    assert "nope.jsonl: No such file or directory" in capsys.readouterr().err


def test_a_shared_system_message_is_computed_once(tmp_path, capsys, monkeypatch):
    path = str(tiny_model(tmp_path / "gemma.gguf", "gemma3"))          # gemma3 has a built-in template
    system = "x" * 120
    stdin = "".join(f"q{i}\n" for i in range(6)) + '{"prompt": "q9", "system": "other"}\n'
    rc, out, err = run(capsys, monkeypatch, stdin, "batch", "-m", path, "-n", "3", "--temperature", "0", "--chat",
                       "--system", system, "--device", "cpu")
    assert rc == 0, err
    assert int(err.split(" prompt tokens from the prefix cache")[0].rsplit(" ", 1)[1]) >= 112
    alone = run(capsys, monkeypatch, "q5\n", "batch", "-m", path, "-n", "3", "--temperature", "0", "--chat",
                "--system", system, "--device", "cpu")[1]
    assert {o["index"]: o["tokens"] for o in out}[5] == alone[0]["tokens"]
    monkeypatch.setattr(sys, "stdin", io.StringIO('{"prompt": "a", "system": "s"}\n'))
    assert main(["batch", "-m", path, "--device", "cpu"]) == 2
    assert 'a system message needs chat (--chat, or "chat": true)' in capsys.readouterr().err


@pytest.mark.gpu
def test_batch_on_the_cuda_executor(tmp_path, capsys, monkeypatch):
    """The same requests through the engine on the CUDA executor: the same output twice, every
    request answered, and a near-uniform seeded one gives `run`'s tokens (its draws are far from
    the rounding of the logits)."""
    from test_cuda_executor import tiny_cuda_model

    path = str(tiny_cuda_model(tmp_path / "tiny.gguf", "qwen3"))
    stdin = "".join(f'{{"prompt": "tok{i} tok{2 * i}", "n": {4 + i}}}\n' for i in range(12))
    stdin += '{"prompt": "abc", "temperature": 50, "top_k": 0, "top_p": 1, "seed": 9}\n'
    runs = []
    for _ in range(2):
        rc, out, err = run(capsys, monkeypatch, stdin, "batch", "-m", path, "-n", "6", "--temperature", "0",
                           "--device", "cuda")
        assert rc == 0, err
        runs.append(sorted(out, key=lambda o: o["index"]))
    assert runs[0] == runs[1] and [o["index"] for o in runs[0]] == list(range(13))
    assert runs[0][12]["tokens"] == single(capsys, path, "abc", 6, "--temperature", "50", "--top-k", "0",
                                           "--top-p", "1", "--seed", "9", device="cuda")


def test_requests_sharing_a_prefix_take_it_from_the_cache(tiny, capsys, monkeypatch):
    head = "x" * 150                                          # ~150 tokens: a step holds three prompts
    prompts = [head + f" q{i}" for i in range(5)]
    rc, out, err = run(capsys, monkeypatch, "\n".join(prompts) + "\n", "batch", "-m", tiny, "-n", "4",
                       "--temperature", "0", "--device", "cpu")
    assert rc == 0, err
    hits = int(err.split(" prompt tokens from the prefix cache")[0].rsplit(" ", 1)[1])
    assert hits >= 128                                        # the last request's eight or more blocks
    by_index = {o["index"]: o["tokens"] for o in out}
    assert by_index[4] == single(capsys, tiny, prompts[4], 4, "--temperature", "0")
