"""Training: the prefix-shared layout, the loss alignment, and end-to-end training with Trainer."""


import pytest
import torch
from transformers import TrainingArguments

from _helpers import prompts, tiny_target
from dart_hf import DartDraftModel
from dart_hf.training import DartDataCollator, DartTrainer, dart_loss, evaluate_draft, prefix_shared_layout, self_distill
from dart_hf.training.trainer import chain_lengths_of, draft_rows, greedy_agreement, rows_loss


def brute_force_layout(num_prefix, anchors, num_masks):
    rows = [("prefix", j, 0) for j in range(num_prefix)]
    rows += [("mask", b, o) for b in range(len(anchors)) for o in range(num_masks)]
    size = len(rows)
    attention = torch.zeros(size, size, dtype=torch.bool)
    positions, targets = [], []
    for r, (kind, index, offset) in enumerate(rows):
        anchor = index if kind == "prefix" else anchors[index]
        depth = 0 if kind == "prefix" else offset + 1
        positions.append(anchor + depth)
        targets.append(anchor + 2 + depth)
        for c, (other_kind, other_index, other_offset) in enumerate(rows):
            if other_kind == "prefix":
                attention[r, c] = other_index <= anchor  # every row sees its own prefix (prefix rows: causal)
            elif kind == "mask":
                attention[r, c] = other_index == index and other_offset <= offset  # causal inside its own block
    return torch.tensor(positions), torch.tensor(targets), attention


@pytest.mark.parametrize("num_prefix,anchors,num_masks", [(1, [0], 1), (5, [0, 2, 4], 3), (9, [8, 1, 3], 7), (12, [], 7)])
def test_layout_equals_brute_force(num_prefix, anchors, num_masks):
    layout = prefix_shared_layout(num_prefix, torch.tensor(anchors, dtype=torch.long), num_masks)
    positions, targets, attention = brute_force_layout(num_prefix, anchors, num_masks)
    assert torch.equal(layout.position_ids, positions)
    assert torch.equal(layout.targets, targets)
    assert torch.equal(layout.attention, attention)


@pytest.mark.parametrize("double_final_norm", [False, True])  # True: a released draft trained from (--init_draft)
def test_prefix_shared_forward_equals_one_forward_per_anchor(double_final_norm):
    target = tiny_target("llama", dtype=torch.float64)
    draft = DartDraftModel.from_target(target, feature_norm=True, double_final_norm=double_final_norm)
    if double_final_norm:  # non-unit norm weights, so that norming twice is another function than norming once
        torch.nn.init.normal_(draft.norm.weight, mean=1.0, std=0.5)
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(1, 10, 96, generator=generator, dtype=torch.float64)
    next_ids = torch.randint(0, 128, (1, 10), generator=generator)
    anchors = torch.tensor([0, 4, 9])
    layout = prefix_shared_layout(10, anchors, 7)
    with torch.no_grad():
        shared = draft(
            features, input_ids=next_ids, position_ids=layout.position_ids[None], num_masks=21,
            attention_mask=layout.additive_mask(torch.float64), logits_to_keep=0,
        ).logits[0]
        for block, anchor in enumerate(anchors.tolist()):
            alone = draft(features[:, : anchor + 1], input_ids=next_ids[:, : anchor + 1]).logits[0]  # [8, V]
            torch.testing.assert_close(shared[anchor], alone[0], rtol=0, atol=1e-10)
            torch.testing.assert_close(shared[10 + 7 * block : 10 + 7 * (block + 1)], alone[1:], rtol=0, atol=1e-10)


def make_examples(target, count, seed, tmp_path, new_tokens=48):
    return self_distill(
        target, [p[0].tolist() for p in prompts(count, seed=seed, min_len=4, max_len=12)], tmp_path / f"sd{seed}.jsonl",
        max_new_tokens=new_tokens, batch_size=16, progress=False,
    )


def test_rows_are_aligned_with_the_target_and_weighted_by_gamma(tmp_path):
    target = tiny_target("qwen3", dtype=torch.float64, seed=4)
    draft = DartDraftModel.from_target(target)
    examples = make_examples(target, 3, seed=5, tmp_path=tmp_path, new_tokens=12)
    batch = DartDataCollator()(examples)
    with torch.no_grad():
        rows = draft_rows(draft, target, batch, num_anchors=4)
    sequence = batch["input_ids"][0]
    # the target logits of a row are the target's prediction for the token the row is supervised with
    layout_targets = prefix_shared_layout(batch["input_ids"].shape[1] - 1, rows.anchors, 7).targets
    for row in torch.nonzero(rows.valid[0]).flatten().tolist():
        position = int(layout_targets[row])
        with torch.no_grad():
            expected = target(sequence[None, :position]).logits[0, -1]
        torch.testing.assert_close(rows.target_logits[0, row], expected, rtol=0, atol=1e-9)
        assert int(rows.target_tokens[0, row]) == int(sequence[position])
    # a draft that reproduces the target's distributions has zero loss; the loss weights are gamma ** depth
    valid = rows.valid
    weights = torch.where(valid, 0.6 ** rows.depths.double(), 0.0)
    assert float(dart_loss(rows.target_logits[valid], rows.target_logits[valid], weights[valid])) == pytest.approx(0, abs=1e-9)
    by_hand, anchors = 0.0, 0
    for b, r in torch.nonzero(valid).tolist():
        p = torch.log_softmax(rows.target_logits[b, r], -1)
        q = torch.log_softmax(rows.draft_logits[b, r].double(), -1)
        by_hand += 0.6 ** int(rows.depths[b, r]) * float((p.exp() * (p - q)).sum())
        anchors += int(rows.depths[b, r]) == 0
    got = float(dart_loss(rows.draft_logits[valid], rows.target_logits[valid], weights[valid]))
    assert got == pytest.approx(by_hand / anchors, rel=1e-6)


def test_the_loss_over_sampled_mask_blocks_estimates_the_loss_with_a_block_at_every_anchor(tmp_path):
    # one sampled block per batch: averaged over the anchor it lands on, the loss must be the loss of the whole
    # layout (every candidate anchor with its block), so sampling blocks leaves the depths their weight
    target = tiny_target("llama", dtype=torch.float64, seed=6)
    draft = DartDraftModel.from_target(target).double()
    examples = make_examples(target, 3, seed=9, tmp_path=tmp_path, new_tokens=8)
    batch = DartDataCollator()(examples)
    with torch.no_grad():
        whole = draft_rows(draft, target, batch, num_anchors=None)
        whole_loss = float(rows_loss(whole, gamma=0.6))
        assert whole.anchor_share == 1.0
        loss_by_anchor = {}
        for seed in range(400):
            torch.manual_seed(seed)
            rows = draft_rows(draft, target, batch, num_anchors=1)
            loss_by_anchor[int(rows.anchors[0])] = float(rows_loss(rows, gamma=0.6))
    assert sorted(loss_by_anchor) == whole.anchors.tolist()  # every candidate anchor drawn
    assert rows.anchor_share == pytest.approx(1 / len(whole.anchors))
    mean_loss = sum(loss_by_anchor.values()) / len(loss_by_anchor)
    assert mean_loss == pytest.approx(whole_loss, rel=1e-6)


def test_supervised_rows_only_give_the_same_loss_gradients_and_agreement(tmp_path):
    target = tiny_target("llama", dtype=torch.float64, seed=3)
    draft = DartDraftModel.from_target(target).double()
    examples = make_examples(target, 4, seed=8, tmp_path=tmp_path, new_tokens=10)
    examples[0]["prompt_ids"] = examples[0]["prompt_ids"] * 4  # a long prompt: many unsupervised rows
    batch = DartDataCollator()(examples)
    results = {}
    for supervised_only in (False, True):
        torch.manual_seed(0)  # the same anchors
        rows = draft_rows(draft, target, batch, num_anchors=6, supervised_only=supervised_only)
        loss = rows_loss(rows, gamma=0.6)
        draft.zero_grad()
        loss.backward()
        grads = [p.grad.clone() for p in draft.parameters() if p.grad is not None]
        hits = draft.draft_to_target(rows.draft_logits.argmax(-1)) == rows.target_logits.argmax(-1)
        results[supervised_only] = loss.detach(), grads, rows, hits[rows.valid]
    (all_loss, all_grads, all_rows, all_hits), (kept_loss, kept_grads, kept_rows, kept_hits) = results.values()
    assert kept_rows.rows is not None and all_rows.rows is None
    assert kept_rows.draft_logits.shape[1] < all_rows.draft_logits.shape[1]  # fewer rows computed
    assert int(kept_rows.valid.sum()) == int(all_rows.valid.sum())
    torch.testing.assert_close(kept_rows.draft_logits, all_rows.draft_logits[:, kept_rows.rows], rtol=0, atol=1e-10)
    torch.testing.assert_close(kept_rows.target_logits, all_rows.target_logits[:, kept_rows.rows], rtol=0, atol=1e-10)
    torch.testing.assert_close(kept_loss, all_loss, rtol=1e-10, atol=0)
    for kept, full in zip(kept_grads, all_grads, strict=True):
        torch.testing.assert_close(kept, full, rtol=1e-8, atol=1e-12)
    assert torch.equal(kept_hits, all_hits)
    with pytest.raises(ValueError, match="supervised_only"):
        chain_lengths_of(kept_hits, kept_rows)


def test_a_teacher_restricted_to_the_draft_vocabulary_gives_the_same_loss_and_gradients(tmp_path):
    from dart_hf.training import CachedFeatureDataset, build_feature_cache
    from dart_hf.training.trainer import draft_vocabulary

    target = tiny_target("qwen2", dtype=torch.float64, seed=3)
    vocab_ids = torch.randperm(target.config.vocab_size, generator=torch.Generator().manual_seed(0))[:48].sort().values
    draft = DartDraftModel.from_target(target, draft_vocab_size=48, draft_to_target_ids=vocab_ids).double()
    examples = [{"prompt_ids": e["prompt_ids"], "response_ids": e["response_ids"]}
                for e in make_examples(target, 4, seed=8, tmp_path=tmp_path, new_tokens=10)]
    cache = build_feature_cache(target, examples, list(draft.config.feature_layers), tmp_path / "cache",
                                dtype=torch.float64, progress=False)
    collator = DartDataCollator()
    batches = {"online": collator(examples),
               "cached": collator([CachedFeatureDataset(examples, cache)[i] for i in range(len(examples))])}
    vocab = draft_vocabulary(draft)
    for source, batch in batches.items():
        results = []
        for teacher_vocab in (None, vocab):
            torch.manual_seed(0)  # the same anchors
            rows = draft_rows(draft, target, batch, num_anchors=6, supervised_only=True, teacher_vocab=teacher_vocab)
            loss = rows_loss(rows, gamma=0.6, draft_vocab_ids=vocab)
            draft.zero_grad()
            loss.backward()
            grads = [p.grad.clone() for p in draft.parameters() if p.grad is not None]
            results.append((loss.detach(), grads, rows))
        (full_loss, full_grads, full_rows), (kept_loss, kept_grads, kept_rows) = results
        assert kept_rows.target_logits.shape[-1] == 48 and full_rows.target_logits.shape[-1] == target.config.vocab_size
        torch.testing.assert_close(kept_rows.target_logits, full_rows.target_logits[..., vocab], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(kept_loss, full_loss, rtol=1e-10, atol=0, msg=source)
        for kept, full in zip(kept_grads, full_grads, strict=True):
            torch.testing.assert_close(kept, full, rtol=1e-8, atol=1e-12)
        # the target's choice: its top token among the draft's; the same as its overall top token where that is one
        full_choice, kept_choice = full_rows.target_choice(), kept_rows.target_choice()
        assert torch.isin(kept_choice, vocab).all()
        inside = torch.isin(full_choice, vocab)
        assert torch.equal(kept_choice[inside], full_choice[inside]) and (~inside).any()
    with pytest.raises(ValueError, match="another vocabulary"):
        rows_loss(kept_rows, gamma=0.6, draft_vocab_ids=vocab.flip(0))


def test_training_lowers_the_loss_lifts_alpha_and_tau_and_stays_lossless(tmp_path):
    torch.manual_seed(0)
    target = tiny_target("llama", seed=7)
    train = make_examples(target, 48, seed=8, tmp_path=tmp_path)
    held_out = make_examples(target, 8, seed=9, tmp_path=tmp_path)
    draft = DartDraftModel.from_target(target, feature_norm=True)
    collator = DartDataCollator()
    before = evaluate_draft(draft, target, held_out, collator)
    args = TrainingArguments(
        output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, max_steps=240, learning_rate=3e-3,
        lr_scheduler_type="cosine", warmup_steps=10, max_grad_norm=0.5, logging_steps=20, save_steps=120,
        report_to=[], remove_unused_columns=False, use_cpu=True, seed=0, disable_tqdm=True,
    )
    trainer = DartTrainer(
        model=draft, args=args, train_dataset=train, data_collator=collator, target=target, anchors_per_sequence=16
    )
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert logs[-1]["loss"] < 0.6 * logs[0]["loss"]
    assert logs[-1]["train_alpha_1"] > logs[0]["train_alpha_1"]  # per-position agreement is logged as it trains
    after = evaluate_draft(draft, target, held_out, collator)
    assert after["alpha_1"] > 0.3 > 10 / 128 and after["alpha_1"] > before["alpha_1"] + 0.2
    assert after["chain_tau"] > before["chain_tau"]

    draft.eval()
    untrained = DartDraftModel.from_target(target, feature_norm=True)
    taus = {"trained": [], "untrained": []}
    for prompt in prompts(6, seed=10, min_len=4, max_len=12):
        expected = target.generate(prompt, max_new_tokens=48, do_sample=False)
        for name, candidate in (("trained", draft), ("untrained", untrained)):
            trees_only = {"lookup_length": 0}  # tau of the drafted trees, not of context-lookup chains
            got = target.generate(prompt, max_new_tokens=48, assistant_model=candidate, tree_options=trees_only)
            assert torch.equal(got, expected)
            taus[name].append(candidate.stats.tau)
    assert sum(taus["trained"]) > sum(taus["untrained"]) * 1.2
    # checkpoints are save_pretrained folders that load as drafts
    reloaded = DartDraftModel.from_pretrained(tmp_path / "run" / "checkpoint-240", target=target)
    assert torch.equal(reloaded.lm_head.weight, draft.lm_head.weight)


@pytest.mark.parametrize("scheduler", ["continuous", "static"])
def test_self_distill_matches_generate_and_resumes(tmp_path, scheduler):
    target = tiny_target("llama", seed=2)
    prompt_ids = [p[0].tolist() for p in prompts(7, seed=9, min_len=3, max_len=10)]
    first = target.generate(torch.tensor([prompt_ids[0]]), max_new_tokens=12, do_sample=False)[0, len(prompt_ids[0]):]
    target.generation_config.eos_token_id = int(first[4])  # rows finish at different steps: finished rows refill
    expected = []
    for ids in prompt_ids:
        out = target.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0, len(ids):].tolist()
        expected.append(out[: out.index(int(first[4])) + 1] if int(first[4]) in out else out)
    assert any(len(e) < 12 for e in expected) and any(len(e) == 12 for e in expected)
    path = tmp_path / "sd.jsonl"
    self_distill(target, prompt_ids[:3], path, max_new_tokens=12, batch_size=2, progress=False, scheduler=scheduler)
    records = self_distill(target, prompt_ids, path, max_new_tokens=12, batch_size=2, progress=False,
                           scheduler=scheduler)
    assert sorted(r["id"] for r in records) == list(range(7))
    for record in records:
        assert record["prompt_ids"] == prompt_ids[record["id"]]
        assert record["response_ids"] == expected[record["id"]]


@pytest.mark.parametrize("scheduler", ["continuous", "static"])
def test_self_distill_stops_at_max_minutes_and_a_rerun_goes_on(tmp_path, monkeypatch, scheduler):
    """On a clock that moves a minute per reading, max_minutes=1.5 lets the static scheduler start one batch and
    stops the continuous one with requests in flight; a rerun without the limit writes what one whole run does."""
    import types

    import dart_hf.training.data as data_module

    target = tiny_target("llama", seed=2)
    prompt_ids = [p[0].tolist() for p in prompts(5, seed=9, min_len=3, max_len=10)]
    settings = dict(max_new_tokens=8, batch_size=2, progress=False, scheduler=scheduler)
    whole = {r["id"]: r for r in self_distill(target, prompt_ids, tmp_path / "whole.jsonl", **settings)}
    readings = iter(range(0, 60_000, 60))
    monkeypatch.setattr(data_module, "time", types.SimpleNamespace(monotonic=lambda: float(next(readings))))
    path = tmp_path / "sd.jsonl"
    first = self_distill(target, prompt_ids, path, max_minutes=1.5, **settings)
    assert len(first) < len(prompt_ids)
    if scheduler == "static":
        assert len(first) == 2
    monkeypatch.undo()
    records = self_distill(target, prompt_ids, path, **settings)
    assert sorted(r["id"] for r in records) == list(range(5))
    assert all(r == whole[r["id"]] for r in records)
    with pytest.raises(ValueError, match="max_minutes"):
        self_distill(target, prompt_ids, path, max_minutes=0)


def test_self_distill_samples_as_generate_does(tmp_path):
    target = tiny_target("llama", seed=2)
    prompt_ids = [p[0].tolist() for p in prompts(3, seed=9, min_len=4, max_len=4)]  # one length: no padding
    records = self_distill(target, prompt_ids, tmp_path / "sd.jsonl", max_new_tokens=12, batch_size=1,
                           progress=False, scheduler="static", temperature=0.8, seed=5)
    greedy = []
    for record in records:
        ids = torch.tensor([prompt_ids[record["id"]]])
        torch.manual_seed(5 + record["id"])
        sampled = target.generate(ids, max_new_tokens=12, do_sample=True, temperature=0.8, top_k=0, top_p=1.0)
        assert record["response_ids"] == sampled[0, ids.shape[1] :].tolist()
        greedy.append(target.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1] :].tolist())
    assert [r["response_ids"] for r in records] != greedy
    continuous = self_distill(target, prompt_ids, tmp_path / "cb.jsonl", max_new_tokens=12, batch_size=2,
                              progress=False, scheduler="continuous", temperature=0.8)
    assert sorted(r["id"] for r in continuous) == [0, 1, 2]
    assert [r["response_ids"] for r in sorted(continuous, key=lambda r: r["id"])] != greedy
    with pytest.raises(ValueError, match="temperature"):
        self_distill(target, prompt_ids, tmp_path / "x.jsonl", temperature=-1.0)


def test_evaluation_batches_are_cut_to_the_logits_budget(tmp_path, monkeypatch):
    """Every reply token is an anchor in evaluation, so a batch holds the target's logits for up to draft_length
    rows per token: with a budget under one example's, each batch is one example (as for Gemma 3's 262,144-token
    vocabulary), and the figures are those of the usual batches (up to a near-tie between batch shapes)."""
    import dart_hf.training.trainer as trainer_module

    target = tiny_target("llama", seed=7)
    held_out = make_examples(target, 6, seed=9, tmp_path=tmp_path)
    draft = DartDraftModel.from_target(target, feature_norm=True)
    sizes = []
    draft_rows = trainer_module.draft_rows
    monkeypatch.setattr(trainer_module, "draft_rows", lambda d, t, batch, **kw: sizes.append(
        batch["input_ids"].shape[0]) or draft_rows(d, t, batch, **kw))
    usual = evaluate_draft(draft, target, held_out, DartDataCollator())
    assert sizes == [6]
    one_at_a_time = evaluate_draft(draft, target, held_out, DartDataCollator(), max_logits_bytes=1)
    assert sizes[1:] == [1] * 6
    assert one_at_a_time == pytest.approx(usual, abs=0.02)


def test_self_distill_rejects_an_unknown_scheduler(tmp_path):
    with pytest.raises(ValueError, match="continuous"):
        self_distill(tiny_target(), [[1, 2]], tmp_path / "x.jsonl", scheduler="paged")


@pytest.mark.parametrize("num_prefix,anchors", [(10, [0, 4, 9]), (150, [3, 64, 100, 149])])
def test_flex_block_mask_equals_the_dense_mask(num_prefix, anchors):
    layout = prefix_shared_layout(num_prefix, torch.tensor(anchors), 7)
    size = len(layout.position_ids)
    q, k = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    assert torch.equal(layout.mask_mod()(0, 0, q, k), layout.attention)  # the closed form is the rule

    target = tiny_target("llama")
    generator = torch.Generator().manual_seed(1)
    features = torch.randn(2, num_prefix, 96, generator=generator)
    next_ids = torch.randint(0, 128, (2, num_prefix), generator=generator)
    draft = DartDraftModel.from_target(target, feature_norm=True)
    logits = {}
    for name, attention_mask in (("dense", layout.additive_mask(torch.float32)), ("flex", layout.block_mask())):
        with torch.no_grad():
            logits[name] = draft(
                features, input_ids=next_ids, position_ids=layout.position_ids[None].expand(2, -1),
                num_masks=7 * len(anchors), attention_mask=attention_mask, logits_to_keep=0,
            ).logits
    torch.testing.assert_close(logits["flex"], logits["dense"], rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention has no backward on CPU (torch raises)")
def test_flex_gradients_equal_dense_gradients_on_cuda():
    layout = prefix_shared_layout(150, torch.tensor([3, 64, 100, 149]), 7)
    target = tiny_target("llama", num_attention_heads=2, num_key_value_heads=1).cuda()  # FlexAttention: head_dim 16
    generator = torch.Generator().manual_seed(1)
    features = torch.randn(2, 150, 96, generator=generator).cuda()
    next_ids = torch.randint(0, 128, (2, 150), generator=generator).cuda()
    grads = {}
    for name, attention_mask in (("dense", layout.additive_mask(torch.float32).cuda()), ("flex", layout.block_mask("cuda"))):
        torch.manual_seed(0)
        draft = DartDraftModel.from_target(target, feature_norm=True).cuda()
        draft(
            features, input_ids=next_ids, position_ids=layout.position_ids[None].expand(2, -1).cuda(),
            num_masks=28, attention_mask=attention_mask, logits_to_keep=0,
        ).logits.square().mean().backward()
        grads[name] = (draft.midlayer.self_attn.q_proj.weight.grad, draft.midlayer.mask_rep.grad)
    for dense, flex in zip(grads["dense"], grads["flex"]):
        torch.testing.assert_close(flex, dense, rtol=1e-3, atol=1e-5)


def test_flex_training_on_cpu_is_refused_with_the_fix(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    target = tiny_target(num_attention_heads=2, num_key_value_heads=1)  # heads of 16: the CPU is what is refused
    with pytest.raises(ValueError, match="no backward pass on CPU.*training_attention='dense'"):
        DartTrainer(model=DartDraftModel.from_target(target), args=args, target=target, training_attention="flex")


def test_flex_training_of_heads_under_16_dimensions_is_refused_with_the_fix(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    target = tiny_target()  # 4 heads of 8 dimensions
    with pytest.raises(ValueError, match="at least 16, and this draft's is 8: .*training_attention='dense'"):
        DartTrainer(model=DartDraftModel.from_target(target), args=args, target=target, training_attention="flex")
    trainer = DartTrainer(model=DartDraftModel.from_target(target), args=args, target=target)
    assert trainer.training_attention == "dense"


def test_draft_rows_flex_equals_dense(tmp_path):
    target = tiny_target("qwen3", seed=4)
    draft = DartDraftModel.from_target(target)
    batch = DartDataCollator()(make_examples(target, 2, seed=5, tmp_path=tmp_path, new_tokens=12))
    with torch.no_grad():
        dense = draft_rows(draft, target, batch, num_anchors=None, attention="dense")
        flex = draft_rows(draft, target, batch, num_anchors=None, attention="flex")
    torch.testing.assert_close(flex.draft_logits, dense.draft_logits, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="dense"):
        draft_rows(draft, target, batch, num_anchors=None, attention="sparse")


def test_group_by_length_buckets_examples_by_token_count(tmp_path):
    target = tiny_target("llama", seed=1)
    examples = [{"prompt_ids": [1] * n, "response_ids": [2] * (3 * n)} for n in (2, 9, 3, 8, 4, 7, 5, 6)]
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=2, use_cpu=True,
                             report_to=[], remove_unused_columns=False, train_sampling_strategy="group_by_length")
    trainer = DartTrainer(model=DartDraftModel.from_target(target).train(), args=args, train_dataset=examples,
                          data_collator=DartDataCollator(), target=target, anchors_per_sequence=4)
    sampler = trainer._get_train_sampler()
    assert sampler.lengths == [8, 36, 12, 32, 16, 28, 20, 24]
    order = list(sampler)
    assert sorted(order) == list(range(8))
    trainer.train()  # runs with the bucketed order


def test_greedy_agreement_matches_the_draft_run_step_by_step():
    target = tiny_target("llama", dtype=torch.float64, seed=6)
    draft = DartDraftModel.from_target(target).eval()
    prompt = prompts(1, seed=7)[0]
    sequence = target.generate(prompt, max_new_tokens=14, do_sample=False)
    prompt_length, length = prompt.shape[1], sequence.shape[1]
    hits, rows = greedy_agreement(draft, target, sequence, prompt_length)

    layers = list(draft.config.feature_layers)
    with torch.no_grad():
        outputs = target(sequence, output_hidden_states=layers)
    features = torch.cat([outputs.hidden_states[i] for i in layers], dim=-1)
    expected_hits = torch.zeros(draft.config.draft_length)
    expected_rows = torch.zeros(draft.config.draft_length)
    for position in range(prompt_length - 2, length - 2):  # the draft row of h_position predicts position + 2 on
        with torch.no_grad():
            logits = draft(features[:, : position + 1], input_ids=sequence[:, 1 : position + 2]).logits[0]
        for depth in range(min(draft.config.draft_length, length - position - 2)):
            guess = int(draft.draft_to_target(logits[depth].argmax()))
            expected_rows[depth] += 1
            expected_hits[depth] += guess == int(sequence[0, position + 2 + depth])
    assert rows.tolist() == expected_rows.tolist()
    assert hits.tolist() == expected_hits.tolist()
