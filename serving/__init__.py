"""TensorFlow Serving client, configs and development server (static_keras.serving)."""
