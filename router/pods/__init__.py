"""What the router knows of the pods and says to them: the live view of the registry (`pod_view`) and the load this
router put on each (`local_load`), which pods serve a request (`routing_policy`), the calls to a pod (`pod_client`)
and its shared DecodeStream (`decode_stream`), and a pod's failed call as a typed error (`pod_errors`)."""
