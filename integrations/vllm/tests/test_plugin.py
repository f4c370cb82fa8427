"""The dart-hf-vllm plugin inside vLLM (run in vLLM's own environment, against fixtures written by dart-hf's):

    python tests/vllm_fixtures.py DIR [--smollm2]                 # dart-hf's environment
    DART_HF_VLLM_FIXTURES=DIR python -m pytest integrations/vllm   # vLLM's environment (this file)
    DART_HF_VLLM_FIXTURES=DIR python -m pytest tests/test_export_vllm.py   # dart-hf's again: the parity replay

The engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) so that the draft's logits can be recorded:
every drafting step's logits go to DIR/<layout>/records.json, which dart-hf's side replays through
`DartDraftModel.forward` with the same target features.
"""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import pytest

FIXTURES = os.environ.get("DART_HF_VLLM_FIXTURES")
pytestmark = pytest.mark.skipif(
    not FIXTURES, reason="needs the fixtures `python tests/vllm_fixtures.py DIR` writes in dart-hf's environment "
    "(set DART_HF_VLLM_FIXTURES=DIR; .ci/run does)"
)
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

PROMPTS = [[5, 17, 33, 2, 90, 11], [40, 41, 42, 43, 44, 40, 41, 42], [7, 7, 100, 3, 64, 64, 9, 12, 30, 31, 33]]
NEW_TOKENS = 24


def generate(target: str, draft: str | None, prompts, draft_length: int = 8, record: list | None = None, **engine):
    """Greedy token ids of each prompt (one request at a time) and the engine's speculative-decoding metrics;
    with `record`, one entry per drafting step: the rows' input ids and positions, and the drafted rows' logits."""
    from vllm import LLM, SamplingParams

    from dart_hf_vllm.model import Eagle3DartForCausalLM

    speculative = None if draft is None else {
        "method": "eagle3", "model": draft, "num_speculative_tokens": draft_length, "parallel_drafting": True,
    }
    llm = LLM(target, speculative_config=speculative, enforce_eager=True, max_model_len=512, dtype="float32",
              disable_log_stats=False, max_num_seqs=1, seed=0, **engine)
    patched = []
    if record is not None:  # from here on, not the start-up's dummy runs
        forward, compute_logits = Eagle3DartForCausalLM.forward, Eagle3DartForCausalLM.compute_logits
        last_inputs = {}

        def recording_forward(self, input_ids, positions, hidden_states, inputs_embeds=None):
            last_inputs.update(input_ids=input_ids.tolist(), positions=positions.tolist())
            return forward(self, input_ids, positions, hidden_states, inputs_embeds)

        def recording_logits(self, hidden_states):
            logits = compute_logits(self, hidden_states)
            record.append({**last_inputs, "logits": logits.float().tolist()})
            return logits

        Eagle3DartForCausalLM.forward, Eagle3DartForCausalLM.compute_logits = recording_forward, recording_logits
        patched = [("forward", forward), ("compute_logits", compute_logits)]
    try:
        params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
        outputs = []
        for prompt in prompts:
            request = {"prompt_token_ids": prompt} if isinstance(prompt, list) else prompt
            outputs.append(list(llm.generate([request], params, use_tqdm=False)[0].outputs[0].token_ids))
        metrics = {m.name: getattr(m, "values", None) or getattr(m, "value", None) for m in llm.get_metrics()
                   if "spec_decode" in m.name}
    finally:
        for name, method in patched:
            setattr(Eagle3DartForCausalLM, name, method)
        del llm
        gc.collect()
    return outputs, metrics


@pytest.mark.parametrize("layout", ["dart", "released"])
def test_greedy_output_equals_vllm_without_speculation_and_the_drafts_are_recorded(layout):
    fixtures = Path(FIXTURES)
    target = str(fixtures / "target")
    config = json.loads((fixtures / layout / "vllm" / "config.json").read_text())
    expected, _ = generate(target, None, PROMPTS)
    records = []
    got, metrics = generate(target, str(fixtures / layout / "vllm"), PROMPTS, config["dart_draft_length"], records)
    assert got == expected
    assert metrics["vllm:spec_decode_num_drafts"] > len(PROMPTS)
    assert len(metrics["vllm:spec_decode_num_accepted_tokens_per_pos"]) == config["dart_draft_length"]
    steps = [r for r in records if config["mask_token_id"] in r["input_ids"]]
    assert len(steps) == len(records) >= 2 * len(PROMPTS)  # several drafting steps per request: cache reuse
    sequences = [prompt + output for prompt, output in zip(PROMPTS, got)]
    (fixtures / layout / "records.json").write_text(json.dumps({"sequences": sequences, "steps": records}))


def test_the_shipped_smollm2_draft_keeps_vllm_greedy_output_and_gets_tokens_accepted():
    fixtures = Path(FIXTURES) / "smollm2"
    if not (fixtures / "target.txt").exists():
        pytest.skip("written only by `python tests/vllm_fixtures.py DIR --smollm2` (needs the converted SmolLM2)")
    target = (fixtures / "target.txt").read_text().strip()
    prompts = [{"prompt": text} for text in (
        "The capital of France is", "def fibonacci(n):\n    ", "Speculative decoding is a technique that",
        "1, 2, 3, 4, 5, 6,",
    )]
    expected, _ = generate(target, None, prompts)
    got, metrics = generate(target, str(fixtures / "vllm"), prompts, 8)
    assert got == expected
    per_position = metrics["vllm:spec_decode_num_accepted_tokens_per_pos"]
    assert metrics["vllm:spec_decode_num_accepted_tokens"] > 0 and per_position[0] >= per_position[-1]
    print(f"SmolLM2 + shipped draft in vLLM: {metrics}")


def test_vllm_serve_with_the_speculative_config_answers_as_without_it():
    """The OpenAI-compatible server `vllm serve TARGET --speculative-config '{...}'` starts (its engine in a process
    of its own, the plugin loaded there through the entry point): greedy completions equal the engine's without
    speculation. Started as `python -m vllm.entrypoints.openai.api_server --model TARGET`, the server `vllm serve`
    runs: vllm-cpu 0.32.0's `vllm` command looks up the metadata of a distribution named "vllm" and fails."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    fixtures = Path(FIXTURES)
    target, draft = str(fixtures / "target"), str(fixtures / "dart" / "vllm")
    expected, _ = generate(target, None, PROMPTS)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    speculative = json.dumps({"method": "eagle3", "model": draft, "num_speculative_tokens": 8,
                              "parallel_drafting": True})
    environment = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", target, "--port", str(port),
         "--speculative-config", speculative, "--enforce-eager", "--max-model-len", "512", "--dtype", "float32"],
        env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "the server did not start"
                time.sleep(2)
        for prompt, tokens in zip(PROMPTS, expected):
            body = json.dumps({"model": target, "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0.0,
                               "ignore_eos": True, "return_tokens_as_token_ids": True, "logprobs": 1}).encode()
            request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                             {"Content-Type": "application/json"})
            reply = json.loads(urllib.request.urlopen(request, timeout=120).read())
            served = [int(token.removeprefix("token_id:")) for token in reply["choices"][0]["logprobs"]["tokens"]]
            assert served == tokens
    finally:
        server.terminate()
        server.wait(timeout=60)
