"""The router's admission control: which Generate calls are refused, which wait and for how long (`admission`), the
counts it decides on (`admission_state`) and the queue the waiting calls stand in (`wait_queue`)."""
