"""Beyond the two studies: the A<->B bridge, the causal test, the bootstrap and the scorecard."""
