"""A Generate call's life in the router: the call end to end (`request_lifecycle`) with its input checks
(`input_checks`), each of its completions (`completion_run`) across legs on pairs of pods (`completion_leg`, the
Prefill stream's tail in `prefill_tail`), the next leg after a failed one (`migration`), what completions share
(`run_context`) and the requests running, for Abort (`running_requests`)."""
