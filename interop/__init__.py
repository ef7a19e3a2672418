"""What other agents see of our tasks over A2A v1.0: the state mapping (``interop.states``), the wire format,
the callers' messages and their push notifications. Below the surfaces, so a worker can deliver pushes."""
