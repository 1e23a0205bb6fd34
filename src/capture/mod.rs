//! Capture ceilings and down-leveling (AEP-0001 §8.2, AEP-0002 §5.1, AEP-0003 §6.4) (stub).
