"""runtime/generate.py's Session: a conversation's K/V kept between generate() calls, so that a call
computes only its prompt's part after the prefix the last call already ran; the tokens are those of
a call without it. CPU (the NumPy executor, a tiny random model); and `glimmer chat` using it."""

import io
import sys

import pytest
from gguf_factory import tiny_model

from glimmer_cupy.cli import main
from glimmer_cupy.errors import GlimmerError
from glimmer_cupy.model.model import load_model
from glimmer_cupy.reference.sampling import GREEDY, SamplingParams
from glimmer_cupy.runtime.generate import GenerationStats, Session, generate
from glimmer_cupy.runtime.host_executor import HostExecutor

SAMPLED = SamplingParams(temperature=50.0, top_k=0, top_p=1.0, seed=11)   # near uniform: the seed shows


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_model(tiny_model(tmp_path_factory.mktemp("s") / "llama.gguf", "llama"))


def fresh(model, prompt, n, params, **kw):
    return list(generate(model, prompt, n, params, executor=HostExecutor(model.decoder, 128), **kw))


def turn(model, session, prompt, n, params, **kw):
    stats = GenerationStats()
    out = list(generate(model, prompt, n, params, stats=stats, session=session, **kw))
    return out, stats.reused_tokens


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "seeded"])
def test_a_turn_computes_only_what_follows_the_last(model, params):
    session = Session(model, HostExecutor(model.decoder, 128))
    first = [3, 70, 200, 5, 9]
    out1, reused = turn(model, session, first, 6, params)
    assert reused == 0 and out1 == fresh(model, first, 6, params)
    # the next prompt: the whole exchange so far, then new tokens; every computed position is reused
    second = first + out1 + [11, 12, 13]
    out2, reused = turn(model, session, second, 6, params)
    assert reused == len(first) + len(out1) - 1       # the last sampled token was never run
    assert out2 == fresh(model, second, 6, params)


def test_a_changed_prompt_reuses_only_the_shared_prefix(model):
    session = Session(model, HostExecutor(model.decoder, 128))
    out1, _ = turn(model, session, [3, 70, 200, 5, 9, 40, 41], 4, GREEDY)
    edited = [3, 70, 201, 5, 9, 40, 41, 50]
    out2, reused = turn(model, session, edited, 5, GREEDY)
    assert reused == 2 and out2 == fresh(model, edited, 5, GREEDY)
    # the same prompt again: all but its last token, which must run to sample the first new one
    out3, reused = turn(model, session, edited, 5, GREEDY)
    assert reused == len(edited) - 1 and out3 == out2
    # a shorter prompt inside the computed ones, and one that shares nothing
    assert turn(model, session, edited[:4], 3, GREEDY) == (fresh(model, edited[:4], 3, GREEDY), 3)
    assert turn(model, session, [7, 8], 3, GREEDY) == (fresh(model, [7, 8], 3, GREEDY), 0)


def test_a_turn_closed_early_and_one_stopped_keep_the_session_whole(model):
    session = Session(model, HostExecutor(model.decoder, 128))
    prompt = [3, 70, 200, 5, 9]
    want = fresh(model, prompt, 8, GREEDY)
    gen = generate(model, prompt, 8, GREEDY, session=session)
    got = [next(gen), next(gen), next(gen)]
    gen.close()                                          # the caller stops reading after 3 tokens
    assert got == want[:3]
    longer = prompt + got + [20]
    out, reused = turn(model, session, longer, 4, GREEDY)
    assert reused == len(prompt) + 2 and out == fresh(model, longer, 4, GREEDY)
    # stopped by a stop token with the next step launched ahead (overlap), which is discarded
    stop = want[2]
    cut = want[:want.index(stop) + 1]
    out, _ = turn(model, session, prompt, 8, GREEDY, stop_ids={stop}, overlap=True)
    assert out == cut
    longer = prompt + cut + [20]
    out, reused = turn(model, session, longer, 4, GREEDY, overlap=True)
    assert reused == len(prompt) + len(cut) - 1 and out == fresh(model, longer, 4, GREEDY)


def test_a_failed_turn_drops_the_kept_cells(model):
    ex = HostExecutor(model.decoder, 128)
    session = Session(model, ex)
    prompt = [3, 70, 200, 5, 9]
    turn(model, session, prompt, 4, GREEDY)
    run_step = ex.run_step

    def broken(*a, **k):
        raise RuntimeError("device fault")

    ex.run_step = broken
    with pytest.raises(RuntimeError, match="device fault"):
        turn(model, session, prompt + [1, 2], 4, GREEDY)
    ex.run_step = run_step
    assert session.seq is None and session.pool.n_free == 127       # every cell back but the scratch
    out, reused = turn(model, session, prompt + [1, 2], 4, GREEDY)
    assert reused == 0 and out == fresh(model, prompt + [1, 2], 4, GREEDY)


def test_a_session_runs_on_its_own_executor(model):
    session = Session(model, HostExecutor(model.decoder, 32))
    with pytest.raises(GlimmerError, match="executor must be the session's"):
        list(generate(model, [1, 2], 2, GREEDY, executor=HostExecutor(model.decoder, 32), session=session))
    with pytest.raises(GlimmerError, match="needs 64 KV cells, the executor's pool holds 32"):
        list(generate(model, list(range(1, 48)), 16, GREEDY, session=session))
    assert Session(model).pool.n_free == model.cfg.context     # NumPy: a whole context, scratch aside


def test_chat_reuses_each_turn(tmp_path, capsys, monkeypatch):
    path = str(tiny_model(tmp_path / "gemma.gguf", "gemma3"))        # gemma3 has a built-in template
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello tok5\ntok7 tok9\n\n"))
    assert main(["chat", "-m", path, "-n", "4", "--temperature", "0", "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    prompts = [line for line in err.splitlines() if line.startswith("prompt:")]
    assert len(prompts) == 2
    assert "already computed" not in prompts[0] and "already computed" in prompts[1]


# ---- GPU: a session on the CUDA executor ------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_session_on_the_cuda_executor(arch, tmp_path):
    """Turns on the CUDA executor (graphs, overlapped steps): a second session making the same calls
    gives the same tokens bit for bit (the same steps), and near-uniform seeded sampling gives a
    fresh call's tokens (the reused K/V came from other step shapes, so greedy could part at a
    near tie; the seeded draws cannot, but where u falls within rounding of a boundary)."""
    from test_cuda_executor import load_decoder, tiny_cuda_model

    from glimmer_cupy.runtime.cuda_executor import CudaExecutor

    dec = load_decoder(tiny_cuda_model(tmp_path / f"{arch}.gguf", arch))

    class M:                                      # the fields generate() reads
        decoder, cfg = dec, dec.cfg

    first = [3, 70, 200, 5, 9]
    runs = []
    for _ in range(2):
        session = Session(M, CudaExecutor(dec, 512))
        outs = []
        for params in (GREEDY, SAMPLED):
            out1, _ = turn(M, session, first, 12, params)
            second = first + out1 + [11, 12, 13]
            out2, reused = turn(M, session, second, 12, params)
            assert reused == len(first) + len(out1) - 1
            outs += [out1, out2]
            if params is SAMPLED:
                ex = CudaExecutor(dec, 512)
                assert out2 == list(generate(M, second, 12, params, executor=ex))
        runs.append(outs)
    assert runs[0] == runs[1]
