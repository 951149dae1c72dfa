"""The Gradio studio: build with :func:`magi2studio.studio.app.create_app`."""
