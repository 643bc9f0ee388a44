"""The parts a constraint layer is made of.

`DecodingConstraint` and `StepProposal` (the contract every consumer reads),
and the composed parts of `AutomatonConstraint` (static_keras.layers): the
step dispatch, transitions and member ranges of the semantic-ID kind, the
sparse step, the dense head, the eligibility filter and dense-step
eligibility, a request's eligibility, the index as weights. Parts hold no
Keras variables of their own: the layer creates them and hands them over.
"""
