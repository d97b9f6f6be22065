"""Study B: tuned-lens translators, readout subspaces, the RSS profile, its phases and their geometry."""
