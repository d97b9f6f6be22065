"""Reproducibility: provenance sidecars (inputs, parameters, software, hashes), code versions
derived from the code a rule reaches, and the jobs an edit would rerun."""
