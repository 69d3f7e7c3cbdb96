"""One module per training command (rl: `upslope train`; sft, rft, dpo, distill), each a
BaseTrainer subclass that wires the shared stages to its objective."""
