"""``drawbridge serve``: many agent connections and several upstreams behind one gateway: the hub that
maps ids, progress tokens and subscriptions between them, and each agent's session."""
