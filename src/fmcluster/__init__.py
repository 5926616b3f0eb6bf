"""fmcluster: validated foundation-model training clusters."""
