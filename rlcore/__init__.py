"""The RL math shared by the VLA trainer (``vla_rl``) and the LLM trainer (``infra.llm``): the clipped
surrogate, group-relative advantages and the KL estimator (:mod:`rlcore.losses`). Torch only; it
imports none of the project's other packages, so both sides may import it."""
