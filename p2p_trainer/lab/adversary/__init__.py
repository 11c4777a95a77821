"""A hostile peer built from the project's own code, for the attack tests and benches.

Two kinds of attacker, both started like any node (`python -m p2p_trainer.lab.adversary ...`):

- a hostile training peer (`peer`): exactly `p2p-trainer join`, except that what it sends in an
  exchange is tampered with (`tamper.py`): contributions scaled, sign-flipped, NaN, or claiming
  the largest weight the bound allows; or, as a part owner, a sign-flipped result;
- a separate attacker node (`records`, `donor`, `streams`) on a plain hivemind DHT: forged
  heartbeat records made with our record encoders (`forger.py`), a donor that serves poisoned
  state under a far-ahead round (`donor.py`), streams that never end (`streams.py`).

`attacks.py` names them; `launch.py` builds their command lines. Nothing here is imported by
the product: an honest peer never runs this code.
"""
