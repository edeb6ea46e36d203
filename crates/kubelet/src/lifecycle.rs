//! Container lifecycle hooks: postStart and preStop.
