"""Human approval as a stage of the pipeline: the engine that settles ``human_approval`` calls on the
state store, the grants it applies, and the gate that puts it behind the policy."""
