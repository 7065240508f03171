"""Agent frameworks' programs, unmodified, trained through the gateway (issue 43): each framework's
example in examples/ run by the openai_agent harness in this process against the shared engine
(tiny model, its real tokenizer and chat template). The tiny model writes no tool call and no
handoff, so these show that every request a framework sends is taken and recorded under the role
its model names; a framework's tool and handoff paths need a model that calls them: the e2e tests
run LangGraph's and the Agents SDK's on SmolLM2-135M-Instruct (one engine for the module), which
calls the tool, and hands off, after two worked examples. docs/frameworks.md says what each
framework's resent history does to the counters."""

import asyncio

import pytest


@pytest.mark.integration
def test_an_agents_sdk_program_runs_unmodified_on_the_session_url(run_harness):
    """examples/agents_sdk_handoff.py (openai-agents 0.24: the Responses API, not streamed by
    Runner.run; a function tool; a handoff) with harness.options.url=session: the run ends with the
    SDK's final output scored by the task; every call is a trainable sequence of the role the SDK's
    model names."""
    from examples.agents_sdk_handoff import MAX_TURNS

    task, seqs, result = run_harness(
        "harnesses.programs.openai_agent.openai_agent",
        ["solver", "checker"],
        max_tokens=1300,
        agent="examples.agents_sdk_handoff.agent",
        url="session",
    )
    assert 1 <= len(seqs) <= MAX_TURNS and seqs[0].agent == "solver", [(s.agent, len(s.completion_ids)) for s in seqs]
    assert all(s.agent in ("solver", "checker") and s.policy == "main" and s.trainable for s in seqs)
    assert result.info["gateway_fresh"] + result.info["gateway_extended"] == len(seqs)
    assert result.info["reward_from"] == "verifier" and result.reward in (0.0, 1.0)


@pytest.mark.unit
def test_the_session_url_option_is_checked_at_start():
    from harnesses.programs.openai_agent import check_options

    with pytest.raises(ValueError, match="harness.options.url='roles' must be role"):
        check_options({"agent": "examples.agents_sdk_handoff.agent", "url": "roles"})


@pytest.mark.integration
@pytest.mark.parametrize(
    "agent, first",
    [("agent", ["solver", "supervisor"]), ("agent_checked", ["solver", "checker", "supervisor"])],
)
def test_a_langgraph_supervisor_runs_unmodified_on_the_session_url(run_harness, agent, first):
    """examples/langgraph_supervisor.py (langgraph 1.2 + langchain-openai 1.8: ChatOpenAI's chat
    completions, a bound tool, three roles by model name): the solver answers first, the supervisor
    then routes (`agent`), or the checker takes every answer first (`agent_checked`: all three roles
    in every trace, the checker's answer scored); every call is a trainable sequence of its role.
    The supervisor's own replies are not in the graph's messages, so each supervisor call is rendered
    fresh (parent None); so is the checker's first, whose history the solver wrote."""
    from examples.langgraph_supervisor import MAX_CALLS

    roles = ["supervisor", "solver", "checker"]
    task, seqs, result = run_harness(
        "harnesses.programs.openai_agent.openai_agent",
        roles,
        max_tokens=24,
        agent=f"examples.langgraph_supervisor.{agent}",
        url="session",
    )
    trace = [(s.agent, s.parent, len(s.completion_ids)) for s in seqs]
    assert len(first) <= len(seqs) <= MAX_CALLS and [s.agent for s in seqs[: len(first)]] == first, trace
    assert all(s.agent in roles and s.policy == "main" and s.trainable for s in seqs), trace
    assert all(s.parent is None for s in seqs if s.agent == "supervisor"), trace
    assert all(s.parent is None for s in seqs[1 : len(first)]), trace
    assert result.info["gateway_extended"] == sum(s.parent is not None for s in seqs), (trace, result.info)
    assert result.info["gateway_fresh"] + result.info["gateway_extended"] == len(seqs)
    assert result.info["reward_from"] == "verifier" and result.reward in (0.0, 1.0)


@pytest.mark.integration
def test_a_smolagents_tool_calling_agent_runs_unmodified_on_its_role_url(run_harness):
    """examples/smolagents_tools.py (smolagents 1.26: a ToolCallingAgent, OpenAIModel's chat
    completions, on a thread): the tiny model's steps call no tool, so the agent runs its steps and
    then its final-answer call; every call is a trainable solver sequence. smolagents rewrites the
    history it resends, and its final-answer call has a system prompt of its own: rendered fresh."""
    from examples.smolagents_tools import MAX_STEPS

    task, seqs, result = run_harness(
        "harnesses.programs.openai_agent.openai_agent",
        ["solver"],
        max_tokens=24,
        agent="examples.smolagents_tools.agent",
    )
    trace = [(s.agent, s.parent, len(s.completion_ids)) for s in seqs]
    assert len(seqs) == MAX_STEPS + 1 and seqs[0].parent is None and seqs[-1].parent is None, trace
    assert all(s.agent == "solver" and s.policy == "main" and s.trainable for s in seqs), trace
    assert result.info["gateway_extended"] == sum(s.parent is not None for s in seqs), (trace, result.info)
    assert result.info["gateway_fresh"] + result.info["gateway_extended"] == len(seqs)
    assert result.info["reward_from"] == "verifier" and result.reward in (0.0, 1.0)


async def smolagents_with_its_default_tool_choice(task, base_url: str, api_key: str) -> str:
    """examples/smolagents_tools.py's agent as smolagents makes it by default: tool_choice 'required'."""
    from smolagents import LogLevel, OpenAIModel, ToolCallingAgent

    from examples.smolagents_tools import PROMPTS, calculator

    model = OpenAIModel("solver", api_base=base_url, api_key=api_key, client_kwargs={"max_retries": 0})
    solver = ToolCallingAgent(
        tools=[calculator], model=model, prompt_templates=PROMPTS, max_steps=1, verbosity_level=LogLevel.OFF
    )
    return str(await asyncio.to_thread(solver.run, task.prompt))


async def langgraph_structured_supervisor(task, base_url: str, api_key: str) -> str:
    """The supervisor of LangGraph's tutorials: ChatOpenAI.with_structured_output (its default method,
    json_schema) picks the next worker."""
    from typing import Literal

    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel

    class Route(BaseModel):
        next: Literal["solver", "checker", "done"]

    supervisor = ChatOpenAI(model="supervisor", base_url=base_url, api_key=api_key, max_retries=0)
    route = await supervisor.with_structured_output(Route).ainvoke(task.prompt)
    return str(route)


@pytest.mark.integration
@pytest.mark.parametrize(
    "agent, roles, refused",
    [
        ("smolagents_with_its_default_tool_choice", ["solver"], "tool_choice='required' is not supported"),
        ("langgraph_structured_supervisor", ["supervisor"], "response_format=.* is not supported"),
    ],
)
def test_what_a_framework_sends_by_default_that_the_learner_cannot_reproduce_fails_the_trace(
    run_harness, agent, roles, refused
):
    """smolagents' ToolCallingAgent forces a tool call (tool_choice 'required'), LangGraph's usual
    supervisor asks for structured output: both need constrained decoding, which the learner cannot
    score, so the gateway's 400 names the field and the trace fails with it (the examples ask for
    tool_choice auto and parse the supervisor's word instead). Nothing is generated."""
    with pytest.raises(Exception, match=refused):
        run_harness(
            "harnesses.programs.openai_agent.openai_agent",
            roles,
            agent=f"tests.rollout.agents.test_frameworks.{agent}",
            url="session",
        )


# ---- e2e: SmolLM2-135M-Instruct, which calls tools after worked examples ----------------------


@pytest.fixture(scope="module")
def smollm2(ray_cluster, engine_cfg):
    """SmolLM2-135M-Instruct on an engine of its own (policy main) and its chat format, started once
    for this module's e2e tests (a start costs ~25 s on the 2-core box)."""
    import ray

    from rollout.agents.chat_format import ChatFormat
    from rollout.config import ModelConfig
    from rollout.models import resolve_model
    from rollout.orchestration.cluster import spawn_engines

    path = resolve_model("smollm2_135m")
    [eng] = spawn_engines({"main": (path, ModelConfig(name="smollm2_135m"), engine_cfg)})["main"]
    try:
        yield eng, ChatFormat.from_pretrained(path)
    finally:
        ray.get(eng.shutdown.remote(), timeout=60)
        ray.kill(eng)


def greedily(smollm2, roles, program, deadline_s=300.0, max_tokens=48):
    """`await program(base_url, api_key)` on a gateway session whose roles all sample SmolLM2
    greedily (at most `max_tokens` a call): its result, the session's counters, the trace's sequences."""
    from rollout.agents.client import Agent, TraceRecorder
    from rollout.config import SamplingConfig
    from rollout.gateway.server import Gateway
    from rollout.orchestration.router import Router

    eng, fmt = smollm2

    async def main():
        gateway = Gateway()
        await gateway.start()
        rec = TraceRecorder("e2e")
        sampling = SamplingConfig(temperature=0.0, max_tokens=max_tokens)
        agents = {r: Agent(r, "main", Router([eng]), fmt, rec, sampling) for r in roles}
        try:
            with gateway.session(agents) as s:
                result = await asyncio.wait_for(program(s.base_url(), s.api_key), deadline_s)
                return result, s.counts(), rec.sequences
        finally:
            await gateway.stop()

    return asyncio.run(main())


TOOL_TURN_391 = "\n<|im_start|>tool\n391<|im_end|>\n<|im_start|>assistant\n"  # SmolLM2's template after a call


@pytest.mark.e2e
def test_a_langgraph_solver_calls_its_tool_and_its_resent_history_extends_token_exact(smollm2):
    """examples/langgraph_supervisor.py's graph on SmolLM2-135M-Instruct (greedy; the gateway's tool
    convention: its template renders no tools), invoked on a conversation with two worked calculator
    examples, as a LangGraph graph is invoked on a history: the solver calls the calculator, LangGraph
    runs it and resends the history with the tool's result, and that call continues the first one's
    ids token for token (one training row); the supervisor, which sees the workers' replies but never
    its own, is rendered fresh."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    from examples.calculator_agent import calculator
    from examples.langgraph_supervisor import MAX_CALLS, build_graph

    def worked(k: int, expression: str) -> list:
        call = {"name": "calculator", "args": {"expression": expression}, "id": f"c{k}"}
        result = calculator(expression)
        return [
            HumanMessage(f"What is {expression}?"),
            AIMessage("", tool_calls=[call]),
            ToolMessage(result, tool_call_id=f"c{k}"),
            AIMessage(f"<answer>{result}</answer>"),
        ]

    history = [*worked(1, "12 + 30"), *worked(2, "7 * 8"), HumanMessage("What is 17 * 23?")]

    async def program(base_url: str, api_key: str) -> list:
        final = await build_graph(base_url, api_key).ainvoke({"messages": history, "calls": 0})
        return final["messages"][len(history) :]

    new, counts, seqs = greedily(smollm2, ("supervisor", "solver", "checker"), program)
    fmt = smollm2[1]
    trace = [(s.agent, s.parent, fmt.tok.decode(s.completion_ids)) for s in seqs]
    call, result = new[0], new[1]
    assert call.tool_calls[0]["name"] == "calculator" and isinstance(result, ToolMessage), trace
    assert result.content == "391", trace
    first, second = seqs[0], seqs[1]
    assert first.agent == second.agent == "solver" and second.parent == 0, trace
    head = first.prompt_ids + first.completion_ids
    assert second.prompt_ids[: len(head)] == head
    assert fmt.tok.decode(second.prompt_ids[len(head) :]) == TOOL_TURN_391
    assert len(seqs) <= MAX_CALLS and all(s.parent is None for s in seqs if s.agent == "supervisor"), trace
    assert counts["gateway_tool_calls"] >= 1 and counts["gateway_extended"] >= 1, counts
    assert counts["gateway_extended"] == sum(s.parent is not None for s in seqs), (trace, counts)
    assert counts["gateway_fresh"] + counts["gateway_extended"] == len(seqs)


@pytest.mark.e2e
def test_an_agents_sdk_solver_calls_its_tool_then_hands_off_to_the_checker(smollm2):
    """examples/agents_sdk_handoff.py's agents (its `run`, as agent_with_examples) on SmolLM2 (greedy), run
    by the SDK's Runner on Responses API input items: its two worked EXAMPLES, each the question, a
    calculator call and its output, a call of the SDK's handoff tool transfer_to_checker and its
    output, and the checker's answer; then the question. The solver calls the calculator; the SDK
    runs it and resends the whole conversation with the result, which continues the first call's ids
    token-exact (one training row). The solver then calls transfer_to_checker: the SDK hands off and
    sends the whole conversation again under the checker's instructions, with no tools, which no
    earlier call of the checker's begins: the checker's call is rendered fresh, a row of its own.
    Both calls (calculator and handoff) are tool calls to the gateway."""
    from examples.agents_sdk_handoff import CHECKER, EXAMPLES, run
    from rollout.trace import prefix_chains

    history = [*EXAMPLES, {"role": "user", "content": "What is 17 * 23?"}]

    async def program(base_url: str, api_key: str):
        return await run(history, base_url, api_key)  # as the example's agent_with_examples runs it

    result, counts, seqs = greedily(smollm2, ("solver", "checker"), program)
    fmt = smollm2[1]
    trace = [(s.agent, s.parent, fmt.tok.decode(s.completion_ids)) for s in seqs]
    # what the SDK did: ran the calculator, handed off, and the checker answered
    new = [item.to_input_item() for item in result.new_items]
    kinds = [(i.get("type"), i.get("name")) for i in new]
    assert kinds == [
        ("function_call", "calculator"),
        ("function_call_output", None),
        ("function_call", "transfer_to_checker"),
        ("function_call_output", None),
        ("message", None),
    ], (kinds, trace)
    assert new[1]["output"] == "391" and result.last_agent.name == "checker", (new, trace)
    assert result.final_output == "<answer>391</answer>", trace
    # every call a trainable sequence of its role, on the one policy
    assert [s.agent for s in seqs] == ["solver", "solver", "checker"], trace
    assert all(s.policy == "main" and s.trainable for s in seqs), trace
    # the call after the calculator's: the first call's prompt + completion + the tool turn with its result
    first, second, checker = seqs
    head = first.prompt_ids + first.completion_ids
    assert second.parent == 0 and second.prompt_ids[: len(head)] == head, trace
    assert fmt.tok.decode(second.prompt_ids[len(head) :]) == TOOL_TURN_391
    # the checker's: the whole conversation, handoff included, rendered fresh under its instructions
    prompt = fmt.tok.decode(checker.prompt_ids)
    assert checker.parent is None and prompt.startswith(f"<|im_start|>system\n{CHECKER}<|im_end|>\n"), prompt
    assert prompt.endswith('<|im_start|>tool\n{"assistant": "checker"}<|im_end|>\n<|im_start|>assistant\n'), prompt
    # the counters, and the learner's rows: the solver's two calls merge, the checker's stands alone
    assert counts == {"gateway_tool_calls": 2, "gateway_extended": 1, "gateway_fresh": 2}, counts
    assert prefix_chains(seqs) == [[0, 1], [2]], trace


@pytest.mark.e2e
def test_an_agents_sdk_team_that_reviews_every_answer_ends_with_the_checker(smollm2):
    """examples/agents_sdk_handoff.py's agent_reviewed on SmolLM2 (greedy), on a bare question: untaught,
    the solver answers itself (no tool call, no handoff), so the program runs the checker on that
    run's conversation (a second Runner.run): two sequences, the solver's and the checker's, the
    checker's rendered fresh under its instructions with the solver's answer in its prompt; its
    answer is the final output."""
    from examples.agents_sdk_handoff import CHECKER, run

    async def program(base_url: str, api_key: str):
        return await run("What is 3 + 4?", base_url, api_key, review=True)

    result, counts, seqs = greedily(smollm2, ("solver", "checker"), program, max_tokens=128)  # the run's budget
    fmt = smollm2[1]
    trace = [(s.agent, s.parent, fmt.tok.decode(s.completion_ids)) for s in seqs]
    assert [s.agent for s in seqs] == ["solver", "checker"] and result.last_agent.name == "checker", trace
    assert all(s.policy == "main" and s.trainable for s in seqs), trace
    solver, checker = seqs
    prompt = fmt.tok.decode(checker.prompt_ids)
    assert checker.parent is None and prompt.startswith(f"<|im_start|>system\n{CHECKER}<|im_end|>\n"), prompt
    assert fmt.tok.decode(solver.completion_ids).removesuffix("<|im_end|>").strip() in prompt, (prompt, trace)
    assert str(result.final_output) == fmt.tok.decode(checker.completion_ids).removesuffix("<|im_end|>"), trace
    assert counts == {"gateway_tool_calls": 0, "gateway_extended": 0, "gateway_fresh": 2}, counts
