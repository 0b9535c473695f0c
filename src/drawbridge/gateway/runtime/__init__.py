"""The one runtime assembly: ``drawbridge wrap`` and ``drawbridge serve`` build the same parts the same
way -- the policy decider, the evidence recorder behind its guard, the state database, the approval
engine and its gate, the pins and their floors, the call pipeline -- and differ only in the transport
and the upstreams they put around them. ``settings`` says what a runtime is built from, ``assembly``
builds and runs it, ``control`` gives the control plane its view, ``serve`` and ``wrap`` add each
command's own parts."""
