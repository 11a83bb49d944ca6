"""The Open Inference Protocol (V2): its tensors, and one model answering it through the
front door (``online.door``)."""
