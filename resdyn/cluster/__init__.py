"""The cluster: GPU kinds and their rates, model shapes and each rule's price (FLOPs, memory,
disk), multi-GPU placement and site settings for SLURM."""
