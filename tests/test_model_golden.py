"""Our NumPy path on the real models against goldens recorded by an independent implementation
(tests/golden/README.md says which and how).

For each prompt the golden's greedy continuation is run through our model in one teacher-forced
step, with logits at every position of the continuation. Our argmax at each of the first 16
positions must be the golden's token — so our own greedy decoding produces the same 16 tokens —
and the logits of the golden's top-5 ids over the recorded steps must agree within LOGIT_ATOL.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from glimmer_cupy.model.model import load_model
from glimmer_cupy.model.step import StepBatch
from glimmer_cupy.runtime.host_executor import HostExecutor

GOLDEN = Path(__file__).parent / "golden"
N_GREEDY = 16
# Both sides decode the same blocks to float32 and differ only in summation order and in
# float32 vs float64 intermediates; 0.02 is ~0.1% of a typical top logit (15-30).
LOGIT_ATOL = 0.02

pytestmark = pytest.mark.model


def teacher_forced_logits(model, ids: list[int], first_row: int) -> np.ndarray:
    """Logits at positions first_row .. len(ids)-1 of one sequence run as a single step."""
    n = len(ids)
    ex = HostExecutor(model.decoder, n + 1)
    cells = np.arange(1, n + 1, dtype=np.int32)
    step = StepBatch(tokens=np.array(ids, np.int32), positions=np.arange(n, dtype=np.int32), cells=cells,
                     tok_seq=np.zeros(n, np.int32), cell_table=cells[None, :], seq_lens=np.array([n], np.int32),
                     logit_rows=np.arange(first_row, n, dtype=np.int32))
    return ex.logits(step)


@pytest.fixture(scope="module", params=["smollm2-135m", "gemma3-270m"])
def case(request, model_file):
    golden = json.loads((GOLDEN / f"{request.param}.json").read_text())
    model = load_model(model_file(request.param))
    return golden, model


def test_golden_prompt_ids_match_our_tokenizer(case):
    golden, model = case
    for p in golden["prompts"]:
        assert model.tokenizer.encode(p["text"]) == p["prompt_ids"], p["text"]


def test_greedy_tokens_and_top5_logits(case):
    golden, model = case
    for p in golden["prompts"]:
        prompt, greedy = p["prompt_ids"], p["greedy_ids"]
        assert len(greedy) >= N_GREEDY
        logits = teacher_forced_logits(model, prompt + greedy[:N_GREEDY - 1], len(prompt) - 1)
        ours = logits.argmax(-1).tolist()
        assert ours == greedy[:N_GREEDY], f"{p['text']!r}: ours {ours} golden {greedy[:N_GREEDY]}"
        worst = 0.0
        for step, top in enumerate(p["top5"][:N_GREEDY]):
            got = logits[step, top["ids"]]
            worst = max(worst, float(np.max(np.abs(got - np.array(top["logits"])))))
            assert set(np.argsort(-logits[step])[:5].tolist()) == set(top["ids"]) or \
                np.sort(logits[step])[-5] - np.sort(logits[step])[-6] < LOGIT_ATOL, f"top-5 set differs at step {step}"
        assert worst < LOGIT_ATOL, f"{p['text']!r}: top-5 logits differ by up to {worst:.4f}"
