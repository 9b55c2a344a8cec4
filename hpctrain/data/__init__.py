"""The built-in datasets (digits, token files) and what every loader shares: splits, augmentation,
DataLoader workers' seeds. May import: run, config, dist; never the trainer (it builds loaders from these)."""
