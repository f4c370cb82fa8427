"""Model card templates for DART drafts (shipped inside the package as `dart_hf.model_cards`)."""
