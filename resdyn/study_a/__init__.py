"""Study A: sublayer Jacobians and activations of the residual stream, their spectra, Schur structure and topology."""
