"""Weight sync, learner to rollout engines, in one place (base layer: imports only torch).

``collective`` is the protocol both ends share (the stateless process group, the rank of every
engine worker, the tensor specs and the broadcast); ``receiver`` is the end an in-process HF model
runs (the transformers engine), ``vllm_worker`` the end vLLM mixes into its workers. The learner's
sending end is ``trainer.learner`` (it owns the model being sent).
"""
