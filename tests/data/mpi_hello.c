/* An MPI program for the interoperability tests: with no argument every rank reports
 * a token sent by rank 0 and agreed on by all; with "abort" rank 1 calls MPI_Abort. */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    int rank, size, token = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc > 1 && strcmp(argv[1], "abort") == 0 && rank == 1)
        MPI_Abort(MPI_COMM_WORLD, 3);
    if (rank == 0) {
        token = 42;
        if (size > 1)
            MPI_Send(&token, 1, MPI_INT, 1, 0, MPI_COMM_WORLD);
    } else if (rank == 1) {
        MPI_Recv(&token, 1, MPI_INT, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    MPI_Allreduce(MPI_IN_PLACE, &token, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    printf("mpi rank %d of %d token %d\n", rank, size, token);
    MPI_Finalize();
    return 0;
}
