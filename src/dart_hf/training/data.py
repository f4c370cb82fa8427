"""Training data: conversations from JSON / JSONL files, chat-template tokenization with a response mask,
self-distillation (the target regenerates the responses), and the collator.

An example is `{"prompt_ids": [...], "response_ids": [...]}`; only response tokens are supervised.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import torch
from tqdm.auto import tqdm


def load_conversations(path: str | os.PathLike, limit: int | None = None) -> list[list[dict]]:
    """Read conversations as lists of `{"role", "content"}` messages. Accepted records: `{"messages": [...]}`,
    ShareGPT `{"conversations": [{"from", "value"}]}`, Alpaca `{"instruction", "input", "output"}`, and
    `{"prompt", "response"}`; a file is a JSON list or JSONL (one record per line). A path that is not a file is
    read as a Hugging Face `datasets` name (`name` or `name:split`, default split "train") when `datasets` is
    installed."""
    if not Path(path).is_file():
        return _dataset_conversations(str(path), limit)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text: pass a JSON or JSONL file of conversations.") from None
    if text.lstrip().startswith("["):
        try:
            records = [(f"{path} record {number}", record) for number, record in enumerate(json.loads(text))]
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not valid JSON ({error.msg} at line {error.lineno}): fix the file.") from None
    else:  # split on "\n" only: str.splitlines() also splits on U+2028 inside JSON strings
        records = []
        for number, line in enumerate(text.split("\n"), start=1):
            if not line.strip():
                continue
            try:
                records.append((f"{path}:{number}", json.loads(line)))
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"{path}:{number} is not JSON ({error.msg} at column {error.colno}): fix or delete that line."
                ) from None
    conversations = []
    for where, record in records:
        conversations.append(_messages(record, where))
        if limit is not None and len(conversations) == limit:
            break
    return conversations


def _dataset_conversations(name: str, limit: int | None) -> list[list[dict]]:
    try:
        import datasets
    except ImportError:
        raise FileNotFoundError(
            f"{name} is not a file, and the `datasets` package that could load it as a dataset is not installed."
        ) from None
    dataset_name, _, split = name.partition(":")
    records = datasets.load_dataset(dataset_name, split=split or "train")
    if limit is not None:
        records = records.select(range(min(limit, len(records))))
    return [_messages(dict(record), f"{name} record {number}") for number, record in enumerate(records)]


def _messages(record: dict, where: str) -> list[dict]:
    roles = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
    if not isinstance(record, dict):
        raise ValueError(f"{where}: a record must be a JSON object, got {type(record).__name__}.")
    if "messages" in record:
        return [{"role": m["role"], "content": m["content"]} for m in record["messages"]]
    if "conversations" in record:
        return [{"role": roles.get(m["from"], m["from"]), "content": m["value"]} for m in record["conversations"]]
    if "instruction" in record:
        prompt = record["instruction"] + (f"\n\n{record['input']}" if record.get("input") else "")
        messages = [{"role": "user", "content": prompt}]
        return messages + ([{"role": "assistant", "content": record["output"]}] if record.get("output") else [])
    if "prompt" in record:
        response = record.get("response", record.get("completion"))
        messages = [{"role": "user", "content": record["prompt"]}]
        return messages + ([{"role": "assistant", "content": response}] if response else [])
    raise ValueError(f"{where}: no 'messages', 'conversations', 'instruction' or 'prompt' field.")


def tokenize_conversation(tokenizer, messages: list[dict]) -> tuple[list[int], list[int] | None]:
    """(prompt ids up to the first assistant turn, with the generation prompt; that turn's ids or None).

    The response ids are what the chat template renders for the assistant turn (end-of-turn token included), so
    they are exactly the tokens the target would have to produce. Without a chat template (a base model) the
    prompt is the messages' text, one per line, with the tokenizer's own special tokens (Gemma's `<bos>`, without
    which it writes noise), and the reply is its text and EOS."""
    first_reply = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    prompt_messages = messages[:first_reply]
    if not prompt_messages:
        raise ValueError("A conversation needs a user turn before the first assistant turn.")
    if getattr(tokenizer, "chat_template", None):  # the template writes the special tokens (BOS) itself
        prompt_text = tokenizer.apply_chat_template(prompt_messages, add_generation_prompt=True, tokenize=False)
        prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    else:  # a base model: the text as `tokenizer(text)` encodes it for `generate`, its BOS included
        prompt_text = "\n".join(m["content"] for m in prompt_messages) + "\n"
        prompt_ids = tokenizer(prompt_text)["input_ids"]
    if first_reply == len(messages):
        return prompt_ids, None
    reply = messages[first_reply]
    full_text = None
    if getattr(tokenizer, "chat_template", None):
        full_text = tokenizer.apply_chat_template(prompt_messages + [reply], tokenize=False)
    if full_text is not None and full_text.startswith(prompt_text):
        response_ids = tokenizer(full_text[len(prompt_text) :], add_special_tokens=False)["input_ids"]
    else:
        response_ids = tokenizer(reply["content"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return prompt_ids, response_ids


@torch.no_grad()
def self_distill(
    target,
    prompts: list[list[int]],
    output_path: str | os.PathLike,
    max_new_tokens: int = 256,
    batch_size: int = 16,
    pad_token_id: int = 0,
    progress: bool = True,
    scheduler: str = "auto",
    temperature: float = 0.0,
    seed: int = 0,
    max_minutes: float | None = None,
) -> list[dict]:
    """Regenerate the responses with the target, so the draft learns the target's own outputs: greedy, or with
    `temperature` > 0 sampled at that temperature from the whole vocabulary (no top-k or top-p), which gives new
    replies to prompts whose greedy reply is already known.

    scheduler "continuous": Transformers' continuous batching (`init_continuous_batching`): a finished row is
    refilled with the next prompt at once, and each response is written as soon as it finishes; `batch_size` caps
    the requests decoded together. "static": prompts grouped by length in left-padded `generate` batches, written
    batch by batch. "auto" (default): continuous on an accelerator, static on a CPU, where continuous batching
    measured slower (SmolLM2-135M, 2 cores, 16 prompts x 48 tokens: 50-58 against 82-86 tokens/s). Either way every
    record is appended to `output_path` (JSONL, one `{"id", "prompt_ids", "response_ids"}` per prompt, id = index in
    `prompts`) and flushed, so an interrupted run loses nothing it already generated; a rerun skips the ids already
    written. Returns all examples in the file. When sampling, the static scheduler seeds each batch with `seed` plus
    its first prompt's id (a rerun of the same batches draws the same replies); the continuous one seeds once.

    max_minutes: stop once this much time has passed (None: when every prompt is done). The static scheduler starts
    no batch after the deadline; the continuous one drops the requests still in flight. Either way what finished is
    on disk and a rerun goes on from there, so a long generation can run in bounded sittings.
    """
    if scheduler not in ("auto", "continuous", "static"):
        raise ValueError(f"scheduler must be 'auto', 'continuous' or 'static', got {scheduler!r}.")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0 is greedy), got {temperature}.")
    if max_minutes is not None and not max_minutes > 0:
        raise ValueError(f"max_minutes must be > 0 (or None for no limit), got {max_minutes}.")
    deadline = time.monotonic() + 60 * max_minutes if max_minutes is not None else float("inf")
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature else {
        "do_sample": False
    }
    if scheduler == "auto":
        scheduler = "static" if target.device.type == "cpu" else "continuous"
    output_path = Path(output_path)
    _drop_partial_last_line(output_path)
    done = {record["id"] for record in _read_jsonl(output_path)[0]}
    todo = sorted((i for i in range(len(prompts)) if i not in done), key=lambda i: len(prompts[i]))
    eos = target.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
    if scheduler == "continuous" and todo:
        torch.manual_seed(seed)
        _self_distill_continuous(
            target, prompts, todo, output_path, max_new_tokens, batch_size, eos_ids, progress, sampling, deadline
        )
        return _read_jsonl(output_path)[0]
    with open(output_path, "a", encoding="utf-8") as handle, tqdm(
        total=len(todo), desc="self-distilling", disable=not progress
    ) as bar:
        for start in range(0, len(todo), batch_size):
            if time.monotonic() > deadline:
                break
            batch = todo[start : start + batch_size]
            width = max(len(prompts[i]) for i in batch)
            input_ids = torch.full((len(batch), width), pad_token_id, dtype=torch.long)
            attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, index in enumerate(batch):
                ids = prompts[index]
                input_ids[row, width - len(ids) :] = torch.tensor(ids)
                attention_mask[row, width - len(ids) :] = 1
            if temperature:
                torch.manual_seed(seed + batch[0])
            output = target.generate(
                input_ids=input_ids.to(target.device), attention_mask=attention_mask.to(target.device),
                max_new_tokens=max_new_tokens, pad_token_id=pad_token_id, **sampling,
            )
            for row, index in enumerate(batch):
                _write_record(handle, index, prompts[index], output[row, width:].tolist(), eos_ids)
            handle.flush()
            bar.update(len(batch))
    return _read_jsonl(output_path)[0]


@torch.no_grad()
def _self_distill_continuous(
    target, prompts: list[list[int]], todo: list[int], output_path: Path, max_new_tokens: int, batch_size: int,
    eos_ids: set[int], progress: bool, sampling: dict, deadline: float,
) -> None:
    """`self_distill` on Transformers' continuous-batching manager: rows are refilled as they finish; it returns
    at `deadline` (`time.monotonic()`) with the unfinished requests dropped."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    generation_config = GenerationConfig(
        max_new_tokens=max_new_tokens, eos_token_id=sorted(eos_ids) or -1,
        pad_token_id=target.generation_config.pad_token_id, **sampling,
    )
    # sized to the workload: the defaults size the cache from free memory, which costs seconds of setup on a CPU
    longest_prompt = max(len(prompts[index]) for index in todo)
    page_size = 32
    batching_config = ContinuousBatchingConfig(
        max_requests_per_batch=batch_size,
        page_size=page_size,
        num_blocks=batch_size * -(-(longest_prompt + max_new_tokens) // page_size),
        max_batch_tokens=longest_prompt + batch_size,
    )
    with open(output_path, "a", encoding="utf-8") as handle, tqdm(
        total=len(todo), desc="self-distilling", disable=not progress
    ) as bar, target.continuous_batching_context_manager(
        generation_config=generation_config, continuous_batching_config=batching_config, warmup=False
    ) as manager:
        for index in todo:
            manager.add_request(prompts[index], request_id=str(index), max_new_tokens=max_new_tokens)
        remaining = set(todo)
        while remaining and time.monotonic() <= deadline:
            result = manager.get_result(timeout=1)
            if result is None:
                if not manager.is_running():
                    raise RuntimeError("Transformers' continuous-batching thread stopped; rerun (the run resumes) "
                                       "or pass scheduler='static'.")
                continue
            if not result.is_finished():
                continue
            index = int(result.request_id)
            _write_record(handle, index, prompts[index], list(result.generated_tokens), eos_ids)
            handle.flush()
            remaining.discard(index)
            bar.update(1)


def load_examples(paths: Iterable[str | os.PathLike], skip_bad_lines: bool = False) -> list[dict]:
    """Examples (`prompt_ids`, `response_ids`) from JSONL files written by `self_distill` or in that form.

    A path that is not a file, a line that is not JSON and a record without both lists of token ids are errors that
    name the file and line; with `skip_bad_lines` the bad lines are skipped instead, and how many is printed per file.
    Records with an empty response are left out (nothing to supervise)."""
    examples = []
    for path in map(Path, paths):
        if not path.is_file():
            raise FileNotFoundError(f"Example file {path} does not exist (or is not a file): check the path.")
        records, skipped = _read_jsonl(path, skip_bad_lines=skip_bad_lines, required=("prompt_ids", "response_ids"))
        if skipped:
            print(f"dart-hf: skipped {skipped} malformed line(s) of {path}")
        examples += [{"prompt_ids": r["prompt_ids"], "response_ids": r["response_ids"]} for r in records
                     if r["response_ids"]]
    return examples


def conversation_examples(tokenizer, conversations: list[list[dict]]) -> list[dict]:
    """Examples from conversations that already hold an assistant reply (used as it is; the target's
    distributions still supervise it, which is about 7x cheaper per token than regenerating it)."""
    examples = []
    for messages in conversations:
        prompt_ids, response_ids = tokenize_conversation(tokenizer, messages)
        if response_ids:
            examples.append({"prompt_ids": prompt_ids, "response_ids": response_ids})
    return examples


def mix_examples(self_distilled: list[dict], existing: list[dict], existing_ratio: float, seed: int = 0) -> list[dict]:
    """All self-distilled examples plus up to `existing_ratio` existing-response examples per self-distilled one
    (all of them when there are no self-distilled examples)."""
    generator = torch.Generator().manual_seed(seed)
    count = len(existing) if not self_distilled else min(len(existing), round(existing_ratio * len(self_distilled)))
    chosen = torch.randperm(len(existing), generator=generator)[:count].tolist()
    return self_distilled + [existing[i] for i in chosen]


def frequent_token_ids(examples: list[dict], size: int, vocab_size: int) -> torch.Tensor:
    """The `size` most frequent response token ids (then the lowest unused ids), sorted: a reduced draft
    vocabulary `[size]` for `DartDraftModel.from_target(..., draft_to_target_ids=...)`."""
    counts = Counter(token for example in examples for token in example["response_ids"])
    chosen = [token for token, _ in counts.most_common(size)]
    filler = (token for token in range(vocab_size) if token not in set(chosen))
    chosen += [next(filler) for _ in range(size - len(chosen))]
    return torch.tensor(sorted(chosen), dtype=torch.long)


class DartDataCollator:
    """Pads examples on the right into `input_ids`, `attention_mask` and `loss_mask` (1 on response tokens).
    Sequences longer than `max_length` are cut at the end. Examples from a `CachedFeatureDataset` also carry the
    target's cached outputs, padded with zeros into `target_features` `[B, W, 3H]` and `target_last_hidden`
    `[B, W, H]`."""

    def __init__(self, pad_token_id: int = 0, max_length: int = 2048):
        self.pad_token_id = pad_token_id
        self.max_length = max_length

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        sequences = [(e["prompt_ids"] + e["response_ids"])[: self.max_length] for e in examples]
        width = max(len(s) for s in sequences)
        batch = {
            "input_ids": torch.full((len(examples), width), self.pad_token_id, dtype=torch.long),
            "attention_mask": torch.zeros((len(examples), width), dtype=torch.long),
            "loss_mask": torch.zeros((len(examples), width), dtype=torch.bool),
        }
        for row, (example, sequence) in enumerate(zip(examples, sequences)):
            batch["input_ids"][row, : len(sequence)] = torch.tensor(sequence)
            batch["attention_mask"][row, : len(sequence)] = 1
            batch["loss_mask"][row, len(example["prompt_ids"]) : len(sequence)] = True
        for name in ("target_features", "target_last_hidden"):
            if name in examples[0]:
                batch[name] = torch.nn.utils.rnn.pad_sequence(
                    [example[name][: len(sequence)] for example, sequence in zip(examples, sequences)],
                    batch_first=True,
                )
        return batch


def _write_record(handle, index: int, prompt: list[int], response: list[int], eos_ids: set[int]) -> None:
    """One self-distilled example as a JSONL line; the response is cut after its first end-of-sequence token."""
    end = next((i + 1 for i, token in enumerate(response) if token in eos_ids), len(response))
    handle.write(json.dumps({"id": index, "prompt_ids": prompt, "response_ids": response[:end]}) + "\n")


def _read_jsonl(
    path: Path, skip_bad_lines: bool = False, required: tuple[str, ...] = ()
) -> tuple[list[dict], int]:
    """The records of a JSONL file (none when it does not exist) and how many bad lines were skipped. A line that
    is not a JSON object holding the `required` keys raises a ValueError naming the file and line, unless
    `skip_bad_lines`."""
    if not path.exists():
        return [], 0
    records, skipped = [], 0
    # split on "\n" only: str.splitlines() also splits on U+2028 inside JSON strings
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text: pass a JSONL file of examples.") from None
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            problem = None if isinstance(record, dict) else "is not a JSON object"
            missing = [key for key in required if problem is None and key not in record]
            problem = problem or (f"has no {missing}" if missing else None)
        except json.JSONDecodeError as error:
            problem = f"is not JSON ({error.msg} at column {error.colno})"
        if problem is None:
            records.append(record)
        elif skip_bad_lines:
            skipped += 1
        else:
            raise ValueError(
                f"{path}:{number} {problem}. Fix or delete that line, or skip malformed lines on purpose "
                "(--skip_bad_lines)."
            )
    return records, skipped


def _drop_partial_last_line(path: Path) -> None:
    """Cut a line left half-written by an interrupted run, so appending starts on a clean line."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])
