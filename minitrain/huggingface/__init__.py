"""`minitrain.huggingface`: Hugging Face integrations, as `ray.train.huggingface`.

`minitrain.huggingface.transformers` holds `RayTrainReportCallback` and `prepare_trainer` for the
`transformers.Trainer`. This package itself imports nothing from Hugging Face.
"""
