"""The one path of a tools/call: parse, identify, resolve, floors, policy, approval, forward, record,
answer. ``call`` holds the lifecycle; the other modules hold the values its stages pass on and the
stages themselves (``deciders``, ``pins``, ``approvals``)."""
