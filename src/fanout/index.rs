//! The subscription index (stub).
