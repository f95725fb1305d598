"""The process around the model: files, devices, signals, logs, caches.

Modules: `files` (the one file layer, local and gs://), `distributed`
(jax.distributed start-up), `cpu_devices` (a CPU's cores as devices),
`host_memory` (glibc's huge pages for XLA:CPU's buffers), `sigterm` (a
SIGTERM as an exception), `library_logs` (the libraries' INFO lines
hidden), `tensorflow_loader` (TensorFlow imported only where used),
`compilation_cache` (XLA's persistent cache), `compile_time` (seconds
spent compiling), `event_loops` (Orbax's event loops closed with no read
in flight), `versions` (the Python, JAX and flax versions supported,
checked at `import mha`). Imports nothing of the model, search or training.
"""
