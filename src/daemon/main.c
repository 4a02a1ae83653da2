/* sluiced -- see daemon.c; main stays tiny so that everything else can be tested. */
#include "daemon.h"

int main(int argc, char **argv)
{
	return daemon_main(argc, argv);
}
