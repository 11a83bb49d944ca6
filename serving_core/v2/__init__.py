"""The Open Inference Protocol (V2): its tensors, and one model answering it through ``Service``."""
