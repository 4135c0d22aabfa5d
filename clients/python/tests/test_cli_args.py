from runledger_client.cli import _attached, parser


def test_a_ticket_that_begins_with_a_dash_is_the_ticket_not_an_option() -> None:
    args = parser().parse_args(_attached(["resume", "r1", "--ticket", "-Xy_9", "--input", "1"]))
    assert (args.id, args.ticket, args.input) == ("r1", "-Xy_9", 1)


def test_other_arguments_pass_unchanged() -> None:
    argv = ["cancel", "r1", "--note", "--ticket"]
    assert _attached(argv) == argv
