//! attr-match filters (AEP-0003 §6): compile once, evaluate per Event (stub).
