from p2p_trainer.cli import main

main()
