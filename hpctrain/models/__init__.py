"""The built-in models (MLP, ConvNet, a small GPT) and the checks a model must pass. May import:
config only: a user's own model needs nothing of hpctrain."""
