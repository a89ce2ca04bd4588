"""The machine a node runs on, and what it lends.

    hardware      detection: CPU, GPU (CUDA / MPS), memory, battery, idle time
    load          a machine in use: idle priority, passive OpenMP waits, threads from the free lent cores
    memory        native heap trims, malloc's figures
    contribution  what a contributor gives: training and CPU time, energy, memory
    guard         the contributor's rules between rounds: snooze, battery, idle, temperature
"""
