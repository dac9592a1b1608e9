"""One package per operator: checks, reference, cpu, triton, and the functional API in __init__."""
