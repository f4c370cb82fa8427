"""Drafts shipped with dart-hf, in `save_pretrained` layout (one folder each; see `dart_hf.zoo.DRAFTS`)."""
