"""SavedModel export of a model plus its index (static_keras.export)."""
