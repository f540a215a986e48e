"""Trainers that take spillarena as a plugin, one module each (importing one needs that trainer).

    spillarena.integrations.axolotl   axolotl:
                                      `plugins: [spillarena.integrations.axolotl.SpillArenaPlugin]`
"""
