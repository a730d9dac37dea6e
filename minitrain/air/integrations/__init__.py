"""`minitrain.air.integrations`: Ray's `ray.air.integrations` import path; holds `keras` only."""
