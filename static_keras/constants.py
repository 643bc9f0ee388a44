"""Sentinel values shared by the host-side (NumPy) and Keras sides of the kit.

A module of its own so that host-side code (index building, the string
logits processor) can use them without importing Keras.
"""

#: Score given to masked tokens in "mask" mode: finite, so a softmax or a
#: log-sum-exp over a row that the index masks entirely stays finite.
MASKED_LOGIT = -1e9
#: Token id of a padding candidate (no valid continuation).
PAD_TOKEN = -1
#: State of a row that has left the valid set (a padding beam).
INVALID_STATE = -1
