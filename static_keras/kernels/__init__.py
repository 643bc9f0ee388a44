"""Device kernels: the tensor math of a decoding step, on any Keras backend.

Functions over tensors (gathers, bit fields, sorted searches, top-k,
eligibility ranks, member ranges), no layers and no weights. Where one
kernel has several formulations with the same answers, the execution plan
(`execution_plan.py`) picks one per backend, device kind and compilation;
a kernel never tests the backend itself.
"""
