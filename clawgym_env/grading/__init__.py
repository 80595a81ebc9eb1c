"""The trusted grader: a sealed ``reward/``, protected inputs restored, agent code run in guest sandboxes."""
