"""Qt views over the Qt-free models in app.models. Each view has `refresh()`, called by the main
window's timer after a batch of events; it redraws only what changed since its last refresh."""
