"""The lab, apart from the library: an emulated WAN (`testbed`), timed fault injection on a live
swarm (`chaos`) and the scale simulator (`sim`). Training never imports from here."""
