"""Human approval as a stage of the pipeline: the engine that settles ``human_approval`` calls on the
state store (``engine``; what it asks in ``questions``, how answers read in ``settlement``, how
approvals end in ``resolutions``, the 2026-07-28 retry in ``request_states``, grants and memory in
``standing``), the grants it applies (``grants``), and the gate that puts it behind the policy."""
